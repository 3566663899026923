// The run's time zero on every rank (train/clock.h): on one host the ranks share one monotonic clock, so each rank's
// origin, read on that clock, must be rank 0's to within the uncertainty the function itself reports, however late a
// rank arrives.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <vector>

#include "tests/mpi/mpi_test_util.h"
#include "train/clock.h"

namespace ddplab {
namespace {

// Each rank's origin next to rank 0's; all ranks must share a host (the tests run on one).
void expect_origins_agree(const ClockOrigin& clock) {
  std::vector<double> origins(world_size());
  MPI_Allgather(&clock.origin_ms, 1, MPI_DOUBLE, origins.data(), 1, MPI_DOUBLE, MPI_COMM_WORLD);
  for (int r = 1; r < world_size(); ++r)
    EXPECT_LE(std::fabs(origins[r] - origins[0]), clock.uncertainty_ms + 1e-9)
        << "rank " << r << "'s time zero is " << origins[r] - origins[0] << " ms off rank 0's, beyond the "
        << clock.uncertainty_ms << " ms the alignment claims";
  EXPECT_GE(clock.uncertainty_ms, 0.0);
}

TEST(ClockOrigin, EveryRankFindsRankZerosInstant) {
  expect_origins_agree(common_clock_origin(MPI_COMM_WORLD));
}

TEST(ClockOrigin, ALateRankStillFindsIt) {
  MPI_Barrier(MPI_COMM_WORLD);
  if (world_rank() == world_size() - 1) sleep_ms(30);  // descheduled on its way out of the barrier
  expect_origins_agree(common_clock_origin(MPI_COMM_WORLD));
}

TEST(ClockOrigin, ALateRankZeroStillGivesItsOwnInstant) {
  MPI_Barrier(MPI_COMM_WORLD);
  const double before = now_ms();
  if (world_rank() == 0) sleep_ms(30);
  const ClockOrigin clock = common_clock_origin(MPI_COMM_WORLD);
  expect_origins_agree(clock);
  if (world_rank() == 0) {
    EXPECT_GE(clock.origin_ms - before, 30.0);
  }
}

TEST(ClockOrigin, OneRoundTripIsEnough) { expect_origins_agree(common_clock_origin(MPI_COMM_WORLD, 1)); }

}  // namespace
}  // namespace ddplab
