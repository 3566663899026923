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

namespace {
// write_timeline() needs a real folder (temporary + rename). One per call, removed on the way out: libFuzzer's
// -merge and timeout children end with _exit, so a folder per process removed at exit was left behind.
struct ScratchFolder {
  char path[32] = "/tmp/ddplab-fuzz-XXXXXX";
  std::string trace;
  ScratchFolder() {
    if (!mkdtemp(path)) std::abort();
    trace = std::string(path) + "/trace.json";
  }
  ~ScratchFolder() {
    std::remove(trace.c_str());
    rmdir(path);
  }
};
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static std::FILE* devnull = std::fopen("/dev/null", "w");
  const hid_t file = ddplab::fuzz::open_image(data, size);
  if (file < 0) return 0;
  try {
    const ddplab::SummarizedRun run = ddplab::summarized(ddplab::read_run_file(file, "fuzz-input.h5"));
    ddplab::print_report(devnull, run);
    ddplab::print_comparison(devnull, {run, run});
    (void)ddplab::report_json(run).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    const ScratchFolder folder;
    ddplab::write_timeline(run.record, folder.trace, /*force=*/true);
  } catch (const std::runtime_error&) {
    // the reader's documented refusal: one line naming the problem
  }
  ddplab::fuzz::close_image(file);
  return 0;
}
