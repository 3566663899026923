// The exit code a GoogleTest binary gives ctest: 1 when a test failed; 77 (ctest's SKIP_RETURN_CODE) when every
// test that ran skipped, as GPU tests do without a GPU; else 0. A binary where some tests pass and some skip passes,
// its skips named in its output. ctest's skip-by-output regex is not used: it marks a test skipped whatever its exit
// code, so one skip would hide another test's failure.
#pragma once
#include <gtest/gtest.h>

namespace ddplab::testing_exit {

inline constexpr int kSkipped = 77;

inline int exit_code(bool failed) {
  const ::testing::UnitTest& u = *::testing::UnitTest::GetInstance();
  if (failed) return 1;
  return u.test_to_run_count() > 0 && u.skipped_test_count() == u.test_to_run_count() ? kSkipped : 0;
}

}  // namespace ddplab::testing_exit
