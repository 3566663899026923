// GoogleTest main for tests launched by mpirun: every rank runs every test; a failure on any rank makes every rank
// exit non-zero, which makes mpirun (and so ctest) fail; otherwise a run that skipped (tests/gtest_exit_code.h) exits
// 77 on every rank, which ctest reports as skipped. Only rank 0 prints the test listing; other
// ranks print only failures, prefixed by their rank. MPI starts at MPI_THREAD_MULTIPLE, as in the ddplab binary
// (runtime/mpi_init.h); a library that gives less ends the test with exit code 2 and the reason.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdio>

#include "runtime/mpi_init.h"
#include "tests/gtest_exit_code.h"

namespace {

class FailuresOnly : public testing::EmptyTestEventListener {
 public:
  explicit FailuresOnly(int rank) : rank_(rank) {}
  void OnTestPartResult(const testing::TestPartResult& result) override {
    if (result.failed())
      std::fprintf(stderr, "[rank %d] %s:%d: Failure\n%s\n", rank_, result.file_name() ? result.file_name() : "?",
                   result.line_number(), result.summary());
  }

 private:
  int rank_;
};

}  // namespace

int main(int argc, char** argv) {
  // The code under test runs communication threads beside the main thread: the same level as the ddplab binary.
  ddplab::init_mpi_multithreaded(&argc, &argv, argv[0]);
  testing::InitGoogleTest(&argc, argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank != 0) {
    auto& listeners = testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new FailuresOnly(rank));
  }
  const int local_failed = RUN_ALL_TESTS() != 0;
  // Every rank learns whether any rank failed, and whether any and every rank's run skipped, so that every rank exits
  // alike: the job skipped where one rank's skip counts (DDPLAB_TEST_ANY_SKIP=1), else only where every rank's run did.
  const int local_skipped = ddplab::testing_exit::skipped();
  int local[3] = {local_failed, local_skipped, !local_skipped}, most[3] = {0, 0, 0};
  MPI_Allreduce(local, most, 3, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  const bool any_failed = most[0] != 0, any_skipped = most[1] != 0, all_skipped = most[2] == 0;
  if (rank == 0 && any_failed && !local_failed) std::fprintf(stderr, "a test failed on another rank\n");
  ddplab::finalize_mpi();
  return ddplab::testing_exit::exit_code(any_failed,
                                         ddplab::testing_exit::any_skip_counts() ? any_skipped : all_skipped);
}
