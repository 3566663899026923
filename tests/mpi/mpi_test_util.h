// Small helpers shared by the multi-rank tests.
#pragma once
#include <mpi.h>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <stdexcept>
#include <string>

#include "runtime/cpu_taken.h"

namespace ddplab {

inline int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

inline int world_size() {
  int n = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

// A folder of files for every rank of the job (on one host): rank 0 makes it and writes the files into it before
// any rank reads them, and removes it once every rank is done.
class SharedTempDir {
 public:
  explicit SharedTempDir(const std::function<void(const std::string&)>& write) {
    char path[64] = "/tmp/ddplab_test_XXXXXX";
    if (world_rank() == 0) {
      try {
        if (!mkdtemp(path)) throw std::runtime_error("mkdtemp failed");
        write(path);
      } catch (const std::exception&) {
        path[0] = '\0';  // told to every rank below, so that none waits for rank 0
      }
    }
    MPI_Bcast(path, sizeof path, MPI_CHAR, 0, MPI_COMM_WORLD);  // after the writes
    if (path[0] == '\0') throw std::runtime_error("rank 0 could not make the test's folder and files");
    path_ = path;
  }
  ~SharedTempDir() {
    MPI_Barrier(MPI_COMM_WORLD);
    if (world_rank() == 0) std::filesystem::remove_all(path_);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Ranks of this job on this node (the GPU tests compare it with the node's device count).
inline int ranks_on_this_node() {
  MPI_Comm node;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
  int n = 1;
  MPI_Comm_size(node, &n);
  MPI_Comm_free(&node);
  return n;
}

// The time, in s, that the ranks' threads waited for a CPU between construction and `total()` (collective): summed
// over the ranks, because each rank's delay can hold up the others in turn. 0 where the kernel does not count it.
// Timing tests excuse lateness up to this, and say so.
class RunQueueDelay {
 public:
  RunQueueDelay() : start_(meter_.read()) {}
  double total() const {
    double mine = taken_between(start_, meter_.read()).cpu_wait_ms;
    mine = std::max(mine, 0.0) * 1e-3;
    MPI_Allreduce(MPI_IN_PLACE, &mine, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    return mine;
  }

 private:
  CpuTakenMeter meter_;
  CpuTaken start_;
};

}  // namespace ddplab
