// Bad input from the user: main() prints it as one line and exits with code 2 on every rank.
#pragma once
#include <stdexcept>

namespace ddplab {

struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

inline void require(bool ok, const std::string& message) {
  if (!ok) throw UsageError(message);
}

}  // namespace ddplab
