// Fuzz target: the run-file reader (record/run_file.h) and, when it accepts a file, what `ddplab report` (text
// and --json) and `ddplab timeline` do with it. The reader promises "a RunRecord is validated, index freely"; the
// analysis relies on that, so it runs on every accepted input.
#include <stdlib.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

#include "analysis/report.h"
#include "analysis/timeline.h"
#include "record/run_file.h"
#include "tests/fuzz/h5_image.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static std::FILE* devnull = std::fopen("/dev/null", "w");
  // write_timeline() needs a real folder (temporary + rename): one per process, removed at exit.
  static char dir[] = "/tmp/ddplab-fuzz-XXXXXX";
  static const std::string trace = [] {
    if (!mkdtemp(dir)) std::abort();
    std::atexit([] {
      std::remove((std::string(dir) + "/trace.json").c_str());
      rmdir(dir);
    });
    return std::string(dir) + "/trace.json";
  }();
  const hid_t file = ddplab::fuzz::open_image(data, size);
  if (file < 0) return 0;
  try {
    const ddplab::SummarizedRun run = ddplab::summarized(ddplab::read_run_file(file, "fuzz-input.h5"));
    ddplab::print_report(devnull, run);
    ddplab::print_comparison(devnull, {run, run});
    (void)ddplab::report_json(run).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    ddplab::write_timeline(run.record, trace, /*force=*/true);
  } catch (const std::runtime_error&) {
    // the reader's documented refusal: one line naming the problem
  }
  ddplab::fuzz::close_image(file);
  return 0;
}
