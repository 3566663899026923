// The command line of a single-process benchmark, read the way ddplab reads its own: --help prints and exits 0,
// bad input is one line naming the problem and exit code 2.
#pragma once
#include <CLI/CLI.hpp>
#include <cstdio>
#include <optional>
#include <string>

#include "launcher/cli_errors.h"
#include "record/files.h"

namespace ddplab::bench {

// The exit code the benchmark should return now (0 after --help, 2 after bad input), or nothing: go on. `speak`
// false: the same verdict, printed by none (the other ranks of an MPI program, which parse the same command line).
inline std::optional<int> parse_command_line(CLI::App& app, int argc, char** argv, const char* program,
                                             bool speak = true) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    if (speak) std::printf("%s", app.help().c_str());
    return 0;
  } catch (const CLI::ParseError& e) {
    if (speak) std::fprintf(stderr, "%s: %s\n", program, parse_error_text(e, app).c_str());
    return 2;
  }
  return std::nullopt;
}

// 2 after one line naming why `path` (given with `flag`) cannot be written, or nothing: go on. Checked before the
// work, so that a bad --csv costs no GPU time; an existing regular file is replaced (a device, pipe or link refuses).
inline std::optional<int> refuse_output(const char* flag, const std::string& path, const char* program) {
  if (path.empty()) return std::nullopt;
  const std::string why = check_output_path(path, /*force=*/true);
  if (why.empty()) return std::nullopt;
  std::fprintf(stderr, "%s: %s %s: %s\n", program, flag, path.c_str(), why.c_str());
  return 2;
}

// One CSV field (RFC 4180): quoted, its quotes doubled, where it holds a comma, a quote or a line break (kernel
// names do: "flash_attention_forward (bf16, causal)").
inline std::string csv_field(const std::string& text) {
  if (text.find_first_of(",\"\r\n") == std::string::npos) return text;
  std::string quoted = "\"";
  for (const char c : text) quoted += c == '"' ? std::string("\"\"") : std::string(1, c);
  return quoted + "\"";
}

}  // namespace ddplab::bench
