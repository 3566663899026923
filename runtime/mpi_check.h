// Checked MPI calls (after llm.c's mpiCheck). Library code never exits: a failed call throws
// std::runtime_error("rank R: MPI_Xxx failed: <MPI_Error_string> (file:line)"); the program's edge prints it.
// MPI only returns error codes on communicators whose error handler is MPI_ERRORS_RETURN (MpiTransport sets it on
// its private duplicate); elsewhere the default handler aborts the job before the check runs.
#pragma once
#include <mpi.h>

#include <stdexcept>
#include <string>

namespace ddplab::comm_detail {

[[noreturn]] inline void throw_mpi_error(int err, const char* call, const char* file, int line) {
  int rank = -1, initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  char text[MPI_MAX_ERROR_STRING] = "unknown MPI error";
  int len = 0;
  MPI_Error_string(err, text, &len);
  const std::string written(call);
  const std::string name = written.substr(0, written.find('('));  // "MPI_Isend(buf, ...)" -> "MPI_Isend"
  throw std::runtime_error("rank " + std::to_string(rank) + ": " + name + " failed: " + text + " (" + file + ":" +
                           std::to_string(line) + ")");
}

inline void check_mpi(int err, const char* call, const char* file, int line) {
  if (err != MPI_SUCCESS) throw_mpi_error(err, call, file, line);
}

}  // namespace ddplab::comm_detail

#define mpiCheck(call) ::ddplab::comm_detail::check_mpi((call), #call, __FILE__, __LINE__)
