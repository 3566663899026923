// Hierarchical all-reduce, for ranks spread over nodes (Horovod's hierarchical all-reduce, NCCL's ring within a
// node): reduce-scatter within the node, all-reduce of each shard among the ranks with the same local rank on the
// other nodes, all-gather within the node. Built from the ring's own pieces (comm/ring_allreduce.h): the two halves
// of the ring schedule over the node's Transport, and the flat ring over the cross-node group's, so the only
// traffic between nodes is the shards' all-reduce (docs/COMM.md: bytes per NIC).
#pragma once
#include <mpi.h>

#include <cstddef>
#include <functional>
#include <memory>
#include <string>

#include "comm/ring_allreduce.h"
#include "comm/topology.h"
#include "comm/transport.h"

namespace ddplab {

class HierAllreduce {
 public:
  // Wraps each group's transport before use, given the group's topology (the node's ranks: one node; the group
  // across nodes: a node each). Tests count the bytes; link emulation delays them by the group's link class.
  using WrapTransport = std::function<std::unique_ptr<Transport>(std::unique_ptr<Transport>, const Topology& group)>;

  // Collective over comm. `node` is any id >= 0, equal on the ranks of one node; a node's ranks and the nodes keep
  // their order in comm. Every node must hold the same number of ranks: the reduce-scatter cuts the buffer into
  // one shard per local rank, and only nodes of equal size cut it at the same places. Otherwise every rank throws
  // std::invalid_argument naming the node sizes, before any group is formed.
  HierAllreduce(MPI_Comm comm, int node, const WrapTransport& wrap = {});
  ~HierAllreduce();

  int nodes() const;
  int local_size() const { return intra_->size(); }
  int local_rank() const { return intra_->rank(); }
  // What each group's hops use: "shm within node (1 peer) + mpi across nodes (1 peer)".
  const std::string& transport_name() const { return transport_name_; }
  // Shared memory reaches one of this rank's peers in either group (its buffers can be registered: single copy).
  bool shm_hop() const { return shm_hop_; }

  // out[i] = sum over the ranks of comm of in[i] (out == in: in place). Every rank calls it with the same count
  // and options and ends bitwise identical to the others. options as for ring_allreduce_sum (both groups use them;
  // a 16-bit wire rounds each finished sum once more, as the flat ring's last hop does).
  // Pipelined by rounds: while a round's shard crosses the nodes (on a worker thread, over the inter-node group's
  // transport), this thread reduce-scatters the next round and all-gathers the previous one within the node, so
  // the slow link is never idle waiting for the node's phases (docs/COMM.md: hier). When it throws, nothing works on
  // `out` any more (a shard still crossing the nodes is stopped and waited for) and this object is done for.
  void allreduce_sum(const float* in, float* out, size_t count, const RingOptions& options);

 private:
  struct CrossNode;  // the group across nodes (the ranks with this local rank) and its thread (hier_allreduce.cpp)
  template <typename Prims>  // the node's rounds with the wire's primitives, each shard crossing the nodes between
  void pipeline_over_nodes(Prims& prims, float* out, size_t count, const RingPlan& plan, const RingOptions& options);

  std::unique_ptr<Transport> intra_;  // this node's ranks
  RingScratch intra_scratch_;
  std::unique_ptr<CrossNode> cross_;
  std::string transport_name_;
  bool shm_hop_ = false;
};

}  // namespace ddplab
