#include "comm/hier_allreduce.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "comm/mpi_check.h"

namespace ddplab {

namespace {

// The group of comm's ranks with the same color, over the transport its topology calls for (within a node shared
// memory, across nodes MPI), wrapped as the caller asks. `ids`: the group's node of each rank of comm (by rank).
std::unique_ptr<Transport> split_transport(MPI_Comm comm, int color, int key, const std::vector<int>& ids,
                                           const HierAllreduce::WrapTransport& wrap, std::string& name) {
  int n = 1;
  mpiCheck(MPI_Comm_size(comm, &n));
  std::vector<int> colors(n), group_ids;
  mpiCheck(MPI_Allgather(&color, 1, MPI_INT, colors.data(), 1, MPI_INT, comm));
  for (int r = 0; r < n; ++r)  // the group keeps comm's order (key = rank)
    if (colors[r] == color) group_ids.push_back(ids[r]);
  const Topology group = topology_from_ids(group_ids);
  MPI_Comm group_comm;
  mpiCheck(MPI_Comm_split(comm, color, key, &group_comm));
  std::unique_ptr<Transport> t = connect_transport(group_comm, group, RingOptions{}, name);  // FIFOs: default size
  mpiCheck(MPI_Comm_free(&group_comm));
  name = describe_hops(group, *t, /*say_where=*/true);
  return wrap ? wrap(std::move(t), group) : std::move(t);
}

}  // namespace

HierAllreduce::HierAllreduce(MPI_Comm comm, int node, const WrapTransport& wrap) {
  int rank = 0, n = 1;
  mpiCheck(MPI_Comm_rank(comm, &rank));
  mpiCheck(MPI_Comm_size(comm, &n));
  std::vector<int> node_of(n);
  mpiCheck(MPI_Allgather(&node, 1, MPI_INT, node_of.data(), 1, MPI_INT, comm));
  const std::vector<int> sizes = topology_from_ids(node_of).node_sizes();  // nodes in the order of their first rank
  if (std::count(sizes.begin(), sizes.end(), sizes[0]) != static_cast<long>(sizes.size())) {
    std::string list;
    for (int s : sizes) list += (list.empty() ? "" : ", ") + std::to_string(s);
    throw std::invalid_argument("hierarchical all-reduce needs the same number of ranks on every node; the " +
                                std::to_string(sizes.size()) + " nodes have " + list + " ranks");
  }
  std::string intra_name, inter_name;
  intra_ = split_transport(comm, node, rank, node_of, wrap, intra_name);
  inter_ = split_transport(comm, intra_->rank(), rank, node_of, wrap, inter_name);
  const bool both = local_size() > 1 && nodes() > 1;
  transport_name_ = both ? intra_name + " + " + inter_name : local_size() > 1 ? intra_name : inter_name;
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
