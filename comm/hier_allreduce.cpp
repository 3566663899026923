#include "comm/hier_allreduce.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "comm/mpi_check.h"

namespace ddplab {

int shared_memory_node(MPI_Comm comm) {
  int rank = 0, lowest = 0;
  mpiCheck(MPI_Comm_rank(comm, &rank));
  MPI_Comm shared;
  mpiCheck(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &shared));
  mpiCheck(MPI_Allreduce(&rank, &lowest, 1, MPI_INT, MPI_MIN, shared));
  mpiCheck(MPI_Comm_free(&shared));
  return lowest;
}

namespace {

// The ranks of each node, nodes in the order of their first rank.
std::vector<int> node_sizes(MPI_Comm comm, int node) {
  int n = 1;
  mpiCheck(MPI_Comm_size(comm, &n));
  std::vector<int> node_of(n);
  mpiCheck(MPI_Allgather(&node, 1, MPI_INT, node_of.data(), 1, MPI_INT, comm));
  std::vector<int> ids, sizes;
  for (int id : node_of) {
    const auto it = std::find(ids.begin(), ids.end(), id);
    if (it == ids.end()) {
      ids.push_back(id);
      sizes.push_back(1);
    } else {
      ++sizes[it - ids.begin()];
    }
  }
  return sizes;
}

std::unique_ptr<Transport> split_transport(MPI_Comm comm, int color, int key,
                                           const HierAllreduce::WrapTransport& wrap) {
  MPI_Comm group;
  mpiCheck(MPI_Comm_split(comm, color, key, &group));
  std::unique_ptr<Transport> t = std::make_unique<MpiTransport>(group);  // on its own duplicate of the group
  mpiCheck(MPI_Comm_free(&group));
  return wrap ? wrap(std::move(t)) : std::move(t);
}

}  // namespace

HierAllreduce::HierAllreduce(MPI_Comm comm, int node, const WrapTransport& wrap) {
  const std::vector<int> sizes = node_sizes(comm, node);
  if (std::count(sizes.begin(), sizes.end(), sizes[0]) != static_cast<long>(sizes.size())) {
    std::string list;
    for (int s : sizes) list += (list.empty() ? "" : ", ") + std::to_string(s);
    throw std::invalid_argument("hierarchical all-reduce needs the same number of ranks on every node; the " +
                                std::to_string(sizes.size()) + " nodes have " + list + " ranks");
  }
  int rank = 0;
  mpiCheck(MPI_Comm_rank(comm, &rank));
  intra_ = split_transport(comm, node, rank, wrap);
  inter_ = split_transport(comm, intra_->rank(), rank, wrap);
}

void HierAllreduce::allreduce_sum(const float* in, float* out, size_t count, const RingOptions& options) {
  const int local = local_size();
  if (local == 1 || count == 0) return ring_allreduce_sum(in, out, count, *inter_, inter_scratch_, options);
  // Round by round, as the flat ring goes (same plan, over the node): each round's owned chunk is this rank's
  // shard, all-reduced across the nodes between the two halves.
  const RingPlan plan = plan_ring(count, local, options);
  RingPrimitives prims(*intra_, in, out, intra_scratch_, plan.max_chunk, plan.slices, options);
  for (size_t begin = 0; begin < count; begin += plan.round) {
    const RingRound round{begin, std::min(plan.round, count - begin), local, local_rank()};
    ring_reduce_scatter<RingSeam::kApart>(prims, round);
    const RingChunk shard = round.owned();
    ring_allreduce_sum(out + shard.offset, shard.count, *inter_, inter_scratch_, options);
    ring_all_gather<RingSeam::kApart>(prims, round);
  }
}

}  // namespace ddplab
