// Reads made in a child process first (record/isolated_read.h): each way a child can end is told apart, nothing the
// child does reaches this process, and the damaged run files that crash or loop inside libhdf5 become one refusal.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstring>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>

#include "record/isolated_read.h"
#include "record/run_file.h"
#include "runtime/errors.h"

namespace ddplab {
namespace {

constexpr double kMiB = 1 << 20;
constexpr ChildCaps kCaps{5, 64 * kMiB, 60};
using How = ChildEnd::How;

TEST(RunInChild, ReturnsWithoutTouchingThisProcess) {
  int changed_there = 0;
  const ChildEnd end = run_in_child([&] { changed_there = 1; }, kCaps);
  EXPECT_EQ(end.how, How::kReturned);
  EXPECT_EQ(changed_there, 0) << "the child's memory is its own";
}

TEST(RunInChild, PassesTheExceptionsMessageAndWhetherItWasBadInput) {
  ChildEnd end = run_in_child([] { throw std::runtime_error("cannot read run file x.h5: missing steps"); }, kCaps);
  EXPECT_EQ(end.how, How::kThrew);
  EXPECT_EQ(end.what, "cannot read run file x.h5: missing steps");
  EXPECT_FALSE(end.usage_error);
  end = run_in_child([] { throw UsageError("settings differ"); }, kCaps);
  EXPECT_EQ(end.how, How::kThrew);
  EXPECT_TRUE(end.usage_error);
}

TEST(RunInChild, AChildKilledFromOutsideIsNotALoop) {
  const ChildEnd end = run_in_child([] { std::raise(SIGKILL); }, kCaps);
  EXPECT_EQ(end.how, How::kKilled);
  EXPECT_EQ(end.what, "SIGKILL");
}

// A file whose read died is refused again without a second child (a resume reads its checkpoint twice).
TEST(ReadFirstInChild, AFileRefusedOnceIsRefusedAgainAtOnce) {
  const std::string path = std::string(DDPLAB_KNOWN_HDF5_CRASHES) + "/run_file-h5hg-read-segv";
  std::string first, again;
  try {
    read_first_in_child(path, "cannot read run file " + path, [&] { (void)read_run_file(path); });
  } catch (const UsageError& e) {
    first = e.what();
  }
  try {
    read_first_in_child(path, "cannot read run file " + path, [] {});  // would come through in a child
  } catch (const UsageError& e) {
    again = e.what();
  }
  EXPECT_NE(first.find("crashed (SIGSEGV)"), std::string::npos) << first;
  EXPECT_EQ(again, first);
}

TEST(RunInChild, AnAllocationPastTheCapIsOutOfMemory) {
  const ChildEnd end = run_in_child(
      [] {
        std::vector<char> claimed(size_t{2} << 30);  // what a damaged size asks for
        claimed[12345] = 1;
      },
      kCaps);
  EXPECT_EQ(end.how, How::kOutOfMemory);
}

TEST(RunInChild, ACrashIsNamedBySignal) {
  const ChildEnd end = run_in_child([] { std::raise(SIGSEGV); }, kCaps);
  EXPECT_EQ(end.how, How::kKilled);
  EXPECT_EQ(end.what, "SIGSEGV");
}

TEST(RunInChild, ALoopEndsAtTheCpuCap) {
  const auto start = std::chrono::steady_clock::now();
  const ChildEnd end = run_in_child(
      [] {
        volatile unsigned long spins = 0;
        for (;;) spins = spins + 1;
      },
      {1, 64 * kMiB, 60});
  EXPECT_EQ(end.how, How::kPastCpuCap);
  // A hang guard, not a speed check: 1 s of CPU, then SIGXCPU, long before the wall-clock cap.
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 60);
}

TEST(RunInChild, AChildBlockedWithoutUsingItsCpuEndsAtTheWallClockCap) {
  const ChildEnd end = run_in_child([] { pause(); }, {5, 64 * kMiB, 0.5});
  EXPECT_EQ(end.how, How::kBlocked);
}

// The inputs that crash or loop inside libhdf5 1.10 (docs/FUZZING.md): one line each, naming the file (a UsageError
// where the child died; the reader's own FileProblem where it threw).
TEST(ReadFirstInChild, DamagedRunFilesAreRefusedInOneLine) {
  for (const char* name : {"run_file-h5hg-read-segv", "run_file-vlen-heap-id-memcpy", "run_file-gcol-free-size-0",
                           "run_file-vlen-length-oom"}) {
    const std::string path = std::string(DDPLAB_KNOWN_HDF5_CRASHES) + "/" + name;
    try {
      read_first_in_child(path, "cannot read run file " + path, [&] { (void)read_run_file(path); });
      ADD_FAILURE() << name << ": read";
    } catch (const std::runtime_error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("cannot read run file " + path + ": "), std::string::npos) << what;
      EXPECT_EQ(what.find('\n'), std::string::npos) << what;
    }
  }
}

}  // namespace
}  // namespace ddplab
