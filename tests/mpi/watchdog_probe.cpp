// The watchdog end to end, in a process of its own (it aborts the job): check_watchdog.py runs it under mpirun.
//
//   watchdog_probe hang MARKER     rank 0 opens a wait that never ends; after the 1 s timeout the watchdog must run
//                                  the abort hook (which creates MARKER), name the wait, and abort the job (code 3)
//   watchdog_probe unread MARKER   rank 0 sends from a registered buffer by reference (single copy) to rank 1,
//                                  which never receives: rank 0's wait_sends waits for an acknowledgement that never
//                                  comes, and the watchdog must end the job as for `hang`
//   watchdog_probe half_shared     rank 0 shares a segment (shm_detail::SharedSegments) with rank 1, which joins
//                                  the exchange of names and is never seen again: rank 0 has created its segment
//                                  and waits for rank 1's, the watchdog ends the job as for `hang`, and its abort
//                                  hook must unlink rank 0's name (whose pid rank 0 prints first)
//   watchdog_probe busy            3 s of short waits (a long operation made of many short ones) under a 1 s
//                                  timeout: no abort, exit 0
//   watchdog_probe stopped         one rank prints its pid and stops itself (SIGSTOP) inside a wait; the test
//                                  continues it seconds later: its own absence is no peer's stall, so no abort, and
//                                  it says that it did not run
//   watchdog_probe finalize        rank 1 stops itself (SIGSTOP) before MPI_Finalize; rank 0's, bounded by
//                                  DDPLAB_MPI_WAIT_S, must leave with code 3 rather than wait for it for good
// Every mode starts MPI as the programs do (runtime/mpi_init.h), bounded the same way: behind a peer that never
// starts MPI, the probe must leave MPI_Init with code 3.
#include <mpi.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "comm/shm_transport.h"
#include "runtime/mpi_init.h"
#include "runtime/watchdog.h"

namespace {

void create_marker(void* path) {
  if (std::FILE* f = std::fopen(static_cast<const char*>(path), "w")) std::fclose(f);
}

}  // namespace

int main(int argc, char** argv) {
  using namespace ddplab;
  watchdog::name_thread("main thread");
  init_mpi_multithreaded(&argc, &argv, "watchdog_probe");
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const std::string mode = argc > 1 ? argv[1] : "";
  watchdog::arm(1.0);
  watchdog::set_step(42);
  if (mode == "hang" && argc > 2) {
    watchdog::add_abort_hook(create_marker, argv[2]);
    if (rank == 0) {
      const watchdog::Wait wait("probe wait from", 1, 7);
      std::this_thread::sleep_for(std::chrono::seconds(60));  // "waiting" for rank 1, which never answers
    }
    MPI_Barrier(MPI_COMM_WORLD);  // the other ranks: held here until the abort ends the job
  } else if (mode == "unread" && argc > 2) {
    watchdog::add_abort_hook(create_marker, argv[2]);
    ShmTransport transport(MPI_COMM_WORLD);
    RegisteredBuffer buffer(MPI_COMM_WORLD, 1 << 20, true);
    if (rank == 0) {
      transport.send(1, buffer.data(), buffer.bytes(), 5);
      transport.wait_sends();
    }
    MPI_Barrier(MPI_COMM_WORLD);
  } else if (mode == "half_shared") {
    if (rank == 0) {
      std::printf("pid %d\n", static_cast<int>(getpid()));
      std::fflush(stdout);
      const watchdog::Wait wait("sharing a segment");
      const shm_detail::SharedSegments shared(MPI_COMM_WORLD, "probe", 1 << 20, "probe: ");
    } else {
      // Step 1's exchange, {pid, process, id, bytes} per rank (comm/shm_segments.cpp), sharing nothing; then gone.
      const uint64_t mine[4] = {static_cast<uint64_t>(getpid()), shm_detail::this_process(), 1, 0};
      std::vector<uint64_t> all(4 * static_cast<size_t>(size));
      MPI_Allgather(mine, 4, MPI_UINT64_T, all.data(), 4, MPI_UINT64_T, MPI_COMM_WORLD);
      std::this_thread::sleep_for(std::chrono::seconds(60));
    }
  } else if (mode == "busy") {
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(3);
    while (std::chrono::steady_clock::now() < end) {
      const watchdog::Wait outer("long operation");  // open for the whole 3 s, but its inner waits progress
      for (int i = 0; i < 300 && std::chrono::steady_clock::now() < end; ++i) {
        const watchdog::Wait inner("short receive", 0, i);
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
    }
  } else if (mode == "stopped") {
    std::printf("pid %d\n", static_cast<int>(getpid()));
    std::fflush(stdout);
    const watchdog::Wait wait("a wait this rank is stopped in");
    raise(SIGSTOP);
    // Past the watchdog's first look after the stop (every 0.25 s at a 1 s timeout), which would have aborted.
    std::this_thread::sleep_for(std::chrono::milliseconds(600));
  } else if (mode == "finalize") {
    watchdog::disarm();
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 1) raise(SIGSTOP);
    finalize_mpi();
    return 0;
  } else {
    if (rank == 0)
      std::fprintf(stderr,
                   "usage: watchdog_probe hang MARKER | unread MARKER | half_shared | busy | stopped | finalize\n");
    MPI_Finalize();
    return 2;
  }
  watchdog::disarm();
  MPI_Finalize();
  return 0;
}
