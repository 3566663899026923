#include "train/clock.h"

#include <algorithm>
#include <limits>

#include "runtime/mpi_check.h"

namespace ddplab {

ClockOrigin common_clock_origin(MPI_Comm comm, int round_trips) {
  constexpr int kTag = 0x71c;  // startup only: no other message of the job is in flight on comm
  int rank = 0, size = 1;
  mpiCheck(MPI_Comm_rank(comm, &rank));
  mpiCheck(MPI_Comm_size(comm, &size));
  ClockOrigin clock;
  double uncertainty = 0;
  if (rank == 0) {
    clock.origin_ms = now_ms();
    // Served one rank at a time, so no rank's round trips wait behind another's.
    for (int peer = 1; peer < size; ++peer)
      for (int i = 0; i < round_trips; ++i) {
        char ping = 0;
        mpiCheck(MPI_Recv(&ping, 1, MPI_CHAR, peer, kTag, comm, MPI_STATUS_IGNORE));
        const double since_origin = now_ms() - clock.origin_ms;
        mpiCheck(MPI_Send(&since_origin, 1, MPI_DOUBLE, peer, kTag, comm));
      }
  } else {
    double fastest = std::numeric_limits<double>::infinity();
    for (int i = 0; i < round_trips; ++i) {
      const char ping = 0;
      double since_origin = 0;
      const double sent = now_ms();
      mpiCheck(MPI_Send(&ping, 1, MPI_CHAR, 0, kTag, comm));
      mpiCheck(MPI_Recv(&since_origin, 1, MPI_DOUBLE, 0, kTag, comm, MPI_STATUS_IGNORE));
      const double received = now_ms();
      // Rank 0 read its clock somewhere in [sent, received]: the midpoint is off by at most half the round trip.
      if (received - sent < fastest) {
        fastest = received - sent;
        clock.origin_ms = (sent + received) / 2 - since_origin;
      }
    }
    uncertainty = fastest / 2;
  }
  mpiCheck(MPI_Allreduce(&uncertainty, &clock.uncertainty_ms, 1, MPI_DOUBLE, MPI_MAX, comm));
  return clock;
}

}  // namespace ddplab
