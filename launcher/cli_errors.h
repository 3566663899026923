// What a bad command line is told, for every program here that reads its flags with CLI11 (ddplab, allreduce_perf,
// the single-process benchmarks).
#pragma once
#include <CLI/CLI.hpp>
#include <string>

namespace ddplab {

// CLI11's own message, except for arguments nothing took: CLI11 2.1 lists those in reverse order ("The following
// arguments were not expected: 3 --stepz"); here they come in the order they were typed.
inline std::string parse_error_text(const CLI::ParseError& e, const CLI::App& app) {
  if (!dynamic_cast<const CLI::ExtrasError*>(&e)) return e.what();
  const std::vector<std::string> unused = app.remaining(/*recurse=*/true);
  if (unused.empty()) return e.what();
  std::string text = unused.front().rfind('-', 0) == 0 ? "unknown option " : "unexpected argument ";
  for (size_t i = 0; i < unused.size(); ++i) text += (i == 1 ? ", followed by " : i > 1 ? " " : "") + unused[i];
  return text;
}

}  // namespace ddplab
