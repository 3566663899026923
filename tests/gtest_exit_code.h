// The exit code a GoogleTest binary gives ctest: 1 when a test failed; else 77 (ctest's SKIP_RETURN_CODE) when the
// run skipped, else 0. A run skipped when every test that ran skipped; under DDPLAB_TEST_ANY_SKIP=1 (the GPU tests,
// and the tests whose timing checks a busy host excuses) when any did, so that no such test is reported passed
// without having checked. A failure is never reported as a skip. (ctest's skip-by-output regex is not used: it marks
// a test skipped whatever its exit code, so one skip hid another test's failure.)
#pragma once
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>

namespace ddplab::testing_exit {

inline constexpr int kSkipped = 77;

// Whether one skip makes the run a skip (DDPLAB_TEST_ANY_SKIP=1), rather than every test's.
inline bool any_skip_counts() {
  const char* any = std::getenv("DDPLAB_TEST_ANY_SKIP");
  return any && std::strcmp(any, "1") == 0;
}

// Whether this process's run counts as skipped, by the rule above.
inline bool skipped() {
  const ::testing::UnitTest& u = *::testing::UnitTest::GetInstance();
  if (any_skip_counts()) return u.skipped_test_count() > 0;
  return u.test_to_run_count() > 0 && u.skipped_test_count() == u.test_to_run_count();
}

inline int exit_code(bool failed, bool skipped) { return failed ? 1 : skipped ? kSkipped : 0; }

}  // namespace ddplab::testing_exit
