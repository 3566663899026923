// Whether the ranks of a communicator were given the same settings (flags, DDPLAB_* knobs): each rank reads its own
// command line and environment, and ranks that differ would pair unrelated buffers or wait on each other in
// different algorithms. One check for every kind of setting.
#pragma once
#include <mpi.h>

#include <string>
#include <utility>
#include <vector>

namespace ddplab {

// Collective. `fields` are (name, value as text), the same names in the same order on every rank. Returns, on every
// rank, "" when every rank holds the same values, else each differing field with rank 0's value and one rank's that
// differs: "lr (rank 0: 0.001, rank 1: 0.01), layers (rank 0: 2, rank 3: 4)". One hashed all-reduce when they agree.
std::string disagreement(const std::vector<std::pair<std::string, std::string>>& fields, MPI_Comm comm);

// Every rank's string, by rank (each cut at MPI_MAX_PROCESSOR_NAME - 1 characters: host names, PCI bus ids, kernel
// names). Collective.
std::vector<std::string> gather_strings(const std::string& mine, MPI_Comm comm);

}  // namespace ddplab
