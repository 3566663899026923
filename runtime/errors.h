// The errors main() ends a command with, each as one line and an exit code of its own (docs/RELIABILITY.md).
#pragma once
#include <stdexcept>
#include <string>

namespace ddplab {

// Bad input from the user: exit code 2 on every rank, before any work.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// An output that could not be written (disk full, quota, I/O error, a read-only folder): a run file, snapshot or
// checkpoint (the training loop stops every rank on it), or a page, trace or JSON file of the commands that read run
// files. Whatever stood under the name is left as it was.
inline constexpr int kExitWriteFailed = 5;
struct WriteFailed : std::runtime_error {
  using std::runtime_error::runtime_error;
};

inline void require(bool ok, const std::string& message) {
  if (!ok) throw UsageError(message);
}

}  // namespace ddplab
