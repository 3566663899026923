#include "comm/hier_allreduce.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <deque>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "comm/transport_table.h"
#include "runtime/mpi_check.h"
#include "runtime/owned_comm.h"
#include "runtime/worker_thread.h"

namespace ddplab {

namespace {

// The group of comm's ranks with the same color, over the transport its topology calls for (within a node shared
// memory, across nodes MPI), wrapped as the caller asks. `ids`: the group's node of each rank of comm (by rank).
// `name`: what its hops use; `shm_hop`: whether shared memory reaches one of its peers. `while_waiting` (if any) is
// set on the transport as connected, beneath the wrapper, where the waits poll (Transport::set_while_waiting).
std::unique_ptr<Transport> split_transport(MPI_Comm comm, int color, int key, const std::vector<int>& ids,
                                           const HierAllreduce::WrapTransport& wrap, std::string& name, bool& shm_hop,
                                           std::function<void()> while_waiting = nullptr) {
  int n = 1;
  mpiCheck(MPI_Comm_size(comm, &n));
  std::vector<int> colors(n), group_ids;
  mpiCheck(MPI_Allgather(&color, 1, MPI_INT, colors.data(), 1, MPI_INT, comm));
  for (int r = 0; r < n; ++r)  // the group keeps comm's order (key = rank)
    if (colors[r] == color) group_ids.push_back(ids[r]);
  const Topology group = topology_from_ids(group_ids);
  OwnedComm group_comm;
  mpiCheck(MPI_Comm_split(comm, color, key, group_comm.receive()));
  ConnectedTransport t = connect_peers(group_comm, group, RingOptions{}, /*say_where=*/true);  // FIFOs: default size
  group_comm.reset();
  name = t.description;
  shm_hop = t.shm_hop;
  if (while_waiting) t.transport->set_while_waiting(std::move(while_waiting));
  return wrap ? wrap(std::move(t.transport), group) : std::move(t.transport);
}

}  // namespace

// The group across nodes and the thread that all-reduces the shards over it, in the order started. Only that
// thread uses the group's transport while the pipeline runs, so the Transport contract (one caller at a time) holds.
struct HierAllreduce::CrossNode {
  std::unique_ptr<Transport> group;
  RingScratch scratch;
  // Set when the node's phases fail mid-pipeline: the group's waits then throw (its hook), so that the shard
  // crossing the nodes lets go of the caller's buffer without waiting for peers that may never answer.
  std::atomic<bool> stop{false};
  WorkerThread worker{"cross-node thread"};  // last: stops before what its jobs use goes
};

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
  bool inter_shm = false;
  intra_ = split_transport(comm, node, rank, node_of, wrap, intra_name, shm_hop_);
  cross_ = std::make_unique<CrossNode>();
  cross_->group =
      split_transport(comm, intra_->rank(), rank, node_of, wrap, inter_name, inter_shm, [&stop = cross_->stop] {
        if (stop.load(std::memory_order_relaxed))
          throw std::runtime_error("cross-node all-reduce stopped: the node's phases failed");
      });
  shm_hop_ = shm_hop_ || inter_shm;
  const bool both = local_size() > 1 && nodes() > 1;
  transport_name_ = both ? intra_name + " + " + inter_name : local_size() > 1 ? intra_name : inter_name;
}

// The cross-node thread is idle whenever allreduce_sum has returned or thrown: joined at once.
HierAllreduce::~HierAllreduce() = default;

int HierAllreduce::nodes() const { return cross_->group->size(); }

// Round by round, as the flat ring goes (same plan, over the node): each round's owned chunk is this rank's shard,
// all-reduced across the nodes between the two halves. Round i's shard crosses the nodes on the worker while this
// thread reduce-scatters round i+1 and all-gathers round i-1: the rounds touch disjoint parts of out, and each half
// ends with every send retired (ring_allreduce.h), so the halves of different rounds may follow one another on the
// node's transport. Every rank runs the same sequence, so messages still pair up.
template <typename Prims>
void HierAllreduce::pipeline_over_nodes(Prims& prims, float* out, size_t count, const RingPlan& plan,
                                        const RingOptions& options) {
  const int local = local_size();
  struct Crossing {
    RingRound round;
    uint64_t ticket;  // its shard's all-reduce on the cross-node thread
  };
  std::deque<Crossing> crossing;  // rounds whose shard is across the nodes, oldest first
  const auto gather_oldest = [&] {
    cross_->worker.wait(crossing.front().ticket);
    ring_all_gather<RingSeam::kApart>(prims, crossing.front().round);
    crossing.pop_front();
  };
  try {
    for (size_t begin = 0; begin < count; begin += plan.round) {
      const RingRound round{begin, std::min(plan.round, count - begin), local, local_rank()};
      ring_reduce_scatter<RingSeam::kApart>(prims, round);
      const RingChunk shard = round.owned();
      CrossNode& cross = *cross_;
      float* data = out + shard.offset;
      crossing.push_back({round, cross.worker.submit([&cross, data, n = shard.count, options] {
                            ring_allreduce_sum(data, data, n, *cross.group, cross.scratch, options);
                          })});
      if (crossing.size() == 2) gather_oldest();  // the previous shard is (nearly) back: gather it while this crosses
    }
    while (!crossing.empty()) gather_oldest();
  } catch (...) {
    // A shard crossing the nodes lies in `out`, its receives posted there: `out` may be freed as this exception
    // unwinds (the trainer's gradients), so the crossing is stopped and waited for first. Bounded: its wait ends at
    // the next poll (the hook), and MpiTransport cancels that wait's receive and settles its sends as it throws.
    cross_->stop = true;
    try {
      cross_->worker.wait_all();
    } catch (...) {  // the stop, or the crossing's own failure: this thread's is the one to report
    }
    throw;
  }
}

void HierAllreduce::allreduce_sum(const float* in, float* out, size_t count, const RingOptions& options) {
  // The node's reduce-scatter leaves partial sums that cross the nodes next: an epilogue there would scale or check
  // them, not the finished sums (the Communicator runs it as a pass of its own afterwards).
  if (options.final_scale != 1.0f || options.check_finite)
    throw std::logic_error("HierAllreduce: the epilogue is a pass of its own after the sum");
  const int local = local_size();
  if (local == 1 || count == 0) {  // nothing to pipeline: the cross-node ring on this thread
    ring_allreduce_sum(in, out, count, *cross_->group, cross_->scratch, options);
    return;
  }
  const RingPlan plan = plan_ring(count, local, options);
  with_ring_primitives(*intra_, in, out, intra_scratch_, plan, options,
                       [&](auto& prims) { pipeline_over_nodes(prims, out, count, plan, options); });
}

}  // namespace ddplab
