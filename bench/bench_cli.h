// The command line of a single-process benchmark, read the way ddplab reads its own: --help prints and exits 0,
// bad input is one line naming the problem and exit code 2.
#pragma once
#include <CLI/CLI.hpp>
#include <cstdio>
#include <optional>

#include "launcher/cli_errors.h"

namespace ddplab::bench {

// The exit code the benchmark should return now (0 after --help, 2 after bad input), or nothing: go on.
inline std::optional<int> parse_command_line(CLI::App& app, int argc, char** argv, const char* program) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    std::printf("%s", app.help().c_str());
    return 0;
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "%s: %s\n", program, parse_error_text(e, app).c_str());
    return 2;
  }
  return std::nullopt;
}

}  // namespace ddplab::bench
