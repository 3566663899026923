// GoogleTest main for single-process tests, with the exit code of tests/gtest_exit_code.h.
#include <gtest/gtest.h>

#include "tests/gtest_exit_code.h"

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  const bool failed = RUN_ALL_TESTS() != 0;
  return ddplab::testing_exit::exit_code(failed, ddplab::testing_exit::skipped());
}
