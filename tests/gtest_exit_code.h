// The exit code a GoogleTest binary gives ctest: 1 when a test failed; else 77 (ctest's SKIP_RETURN_CODE) when any
// test skipped, as GPU tests do without a GPU; else 0. So a skip is never reported as a pass, and a failure never as
// a skip. (ctest's skip-by-output regex is not used: it marks a test skipped whatever its exit code, so one skip hid
// another test's failure.)
#pragma once
#include <gtest/gtest.h>

namespace ddplab::testing_exit {

inline constexpr int kSkipped = 77;

inline bool any_skipped() { return ::testing::UnitTest::GetInstance()->skipped_test_count() > 0; }

inline int exit_code(bool failed, bool skipped) { return failed ? 1 : skipped ? kSkipped : 0; }

}  // namespace ddplab::testing_exit
