// MPI start-up for every ddplab program that runs our communication threads: the ddplab binary, the MPI tests' main,
// allreduce_perf. ddplab calls MPI from several threads at once — a reducer's comm thread (ddp/reducer.h) or the
// GPU ring's (comm/ring_cuda.h) exchanges buckets while the main thread runs the step's agreement (MPI_Iallreduce),
// and the watchdog's thread may call MPI_Abort — so it needs MPI_THREAD_MULTIPLE. Below that level concurrent calls
// are undefined behaviour (mixed-up messages, hangs), never an error code, so a library that gives less is refused
// at start, before any work.
#pragma once
#include <mpi.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "runtime/settings.h"
#include "runtime/watchdog.h"

namespace ddplab {

inline const char* mpi_thread_level_name(int level) {
  switch (level) {
    case MPI_THREAD_SINGLE: return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED: return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED: return "MPI_THREAD_SERIALIZED";
    case MPI_THREAD_MULTIPLE: return "MPI_THREAD_MULTIPLE";
  }
  return "an unknown thread level";
}

// "" when `provided` (MPI_Init_thread's answer) lets several threads call MPI at once, else why not, in one line.
inline std::string mpi_thread_level_shortfall(int provided) {
  if (provided >= MPI_THREAD_MULTIPLE) return "";
  return std::string("the MPI library provides ") + mpi_thread_level_name(provided) +
         ", but ddplab's communication threads call MPI beside the main thread and need MPI_THREAD_MULTIPLE: "
         "use an MPI library built with thread support (Open MPI >= 3 and MPICH have it by default)";
}

// DDPLAB_MPI_WAIT_S (runtime/settings.h). Read where MPI may not be up yet: a bad value takes the default here, and
// settings::check_all refuses it once MPI is up.
inline double mpi_wait_bound_s() {
  try {
    return static_cast<double>(settings::integer(settings::kMpiWaitS));
  } catch (const settings::BadSetting&) {
    return std::atof(settings::kMpiWaitS.default_text);
  }
}

// MPI_Finalize, bounded: it waits for every rank, and one stopped before it kept the others there for good. Past the
// bound this rank leaves without it (exit code 3): its work is done and written, and its output flushed first.
inline void finalize_mpi() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;  // the file commands finalize before their work (launcher/main.cpp); main calls again
  std::fflush(nullptr);
  const watchdog::StartupWait finishing("MPI_Finalize: every rank of the job finishing (DDPLAB_MPI_WAIT_S)",
                                        mpi_wait_bound_s(), watchdog::StartupWait::Mpi::kOutside);
  MPI_Finalize();
}

// After MPI_Init_thread: every rank learns the lowest level any rank got (so none goes on while another stops);
// below MPI_THREAD_MULTIPLE, rank 0 prints "<program>: error: <reason>" and every rank finalizes MPI and exits 2.
inline void require_mpi_thread_multiple(int provided, const char* program) {
  int lowest = provided;
  MPI_Allreduce(&provided, &lowest, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  const std::string shortfall = mpi_thread_level_shortfall(lowest);
  if (shortfall.empty()) return;
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank == 0) std::fprintf(stderr, "%s: error: %s\n", program, shortfall.c_str());
  finalize_mpi();
  std::exit(2);
}

// MPI_Init_thread asking for MPI_THREAD_MULTIPLE; returns the level the library provides, for
// require_mpi_thread_multiple (the programs make that first collective under the watchdog, runtime/watchdog.h).
// Bounded: Open MPI's MPI_Init waits for every rank of the job, and a rank stopped before it (seen: in the dynamic
// loader) kept the others there for good.
inline int start_mpi_multithreaded(int* argc, char*** argv) {
  int provided = MPI_THREAD_SINGLE;
  const watchdog::StartupWait joining("MPI_Init: every rank of the job joining (DDPLAB_MPI_WAIT_S)", mpi_wait_bound_s(),
                                      watchdog::StartupWait::Mpi::kOutside);
  MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided);
  return provided;
}

// start_mpi_multithreaded, then require_mpi_thread_multiple.
inline void init_mpi_multithreaded(int* argc, char*** argv, const char* program) {
  require_mpi_thread_multiple(start_mpi_multithreaded(argc, argv), program);
}

}  // namespace ddplab
