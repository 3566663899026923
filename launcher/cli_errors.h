// What a bad command line is told, for every program here that reads its flags with CLI11 (ddplab, allreduce_perf,
// the single-process benchmarks).
#pragma once
#include <CLI/CLI.hpp>
#include <string>

namespace ddplab {

// CLI11's own message, except for a flag given twice, and for arguments nothing took: CLI11 2.1 lists those in
// reverse order ("The following arguments were not expected: 3 --stepz"); here they come in the order typed.
inline std::string parse_error_text(const CLI::ParseError& e, const CLI::App& app) {
  // A flag given twice: CLI11 says "--batching: At Most 1 required but received 2".
  const std::string what = e.what();
  const size_t at_most = what.find(": At Most 1 required but received ");
  if (dynamic_cast<const CLI::ArgumentMismatch*>(&e) && at_most != std::string::npos)
    return what.substr(0, at_most) + " given more than once (it takes one value)";
  if (!dynamic_cast<const CLI::ExtrasError*>(&e)) return what;
  const std::vector<std::string> unused = app.remaining(/*recurse=*/true);
  if (unused.empty()) return e.what();
  std::string text = unused.front().rfind('-', 0) == 0 ? "unknown option " : "unexpected argument ";
  for (size_t i = 0; i < unused.size(); ++i) text += (i == 1 ? ", followed by " : i > 1 ? " " : "") + unused[i];
  return text;
}

}  // namespace ddplab
