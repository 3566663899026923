// GoogleTest main for single-process tests, with the exit code of tests/gtest_exit_code.h.
#include <gtest/gtest.h>

#include "tests/gtest_exit_code.h"

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  return ddplab::testing_exit::exit_code(RUN_ALL_TESTS() != 0);
}
