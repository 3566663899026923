// The ring's transport, chosen per peer from a table, as NCCL keeps its transports (p2p, shm, net: each with a
// canConnect and a setup, tried in order for every peer). For host memory the table is
//   shm  shared memory (comm/shm_transport.h): a peer on this rank's node that also shares its host;
//   mpi  MPI point-to-point (comm/transport.h): any peer.
// Each peer takes the first entry that can connect to it. An entry that cannot keeps its reason, and the description
// names it where a reader would expect that entry: "mpi (shm: DDPLAB_COMM_TRANSPORT=mpi)". A setup that fails is
// such a reason too; nothing falls back without saying so. Link emulation (comm/link_emulation.h) is not an entry:
// it delays whatever carries a hop, so it wraps the table's result. GPU buffers have their own table of ring links
// (comm/ring_cuda.cpp: ipc, nccl, host).
#pragma once
#include <mpi.h>

#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "comm/ring_allreduce.h"
#include "comm/topology.h"
#include "comm/transport.h"

namespace ddplab {

class ShmTransport;

// What an entry may look at to decide: the same facts on every rank, so both ends of a pair decide alike.
struct PeerQuery {
  const Topology& topology;
  const std::vector<int>& host_of_rank;
  const RingOptions& ring;  // sizes the shared-memory FIFOs
};

struct HostTransportEntry {
  const char* name;
  // Empty when rank `from` can reach rank `to` through this entry; else why not, in a few words. Symmetric.
  std::string (*cannot_connect)(const PeerQuery& q, int from, int to);
  // Collective over comm, called on every rank when any rank routes a pair to the entry: the transport for those
  // pairs. Throws std::runtime_error when it cannot be built, on every rank of a pair alike.
  std::unique_ptr<Transport> (*setup)(MPI_Comm comm, const PeerQuery& q);
};
const std::vector<HostTransportEntry>& host_transport_table();

// Several transports behind one, each peer reached through its own (`route`, by rank; the entries of `transports`
// may be null where no peer uses them). Sends complete in the order they were started across all of them, as the
// Transport contract says: wait_sends asks each for its share of the last keep_last. While one waits it moves the
// others' sends along and calls the hook set on this transport (Transport::set_while_waiting).
class RoutedTransport final : public Transport {
 public:
  RoutedTransport(std::vector<std::unique_ptr<Transport>> transports, std::vector<int> route);
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void send(int peer, const void* buf, size_t bytes, int tag) override;
  void recv(int peer, void* buf, size_t bytes, int tag) override;
  void recv_consume(int peer, size_t bytes, int tag, void* staging, const Consume& consume) override;
  void wait_sends(size_t keep_last = 0) override;
  bool progress() override;

 private:
  Transport& to(int peer);
  std::vector<std::unique_ptr<Transport>> transports_;
  std::vector<int> route_;
  std::deque<int> started_;    // each send in flight, oldest first: the index of its transport
  std::vector<size_t> keep_;   // wait_sends' scratch, per transport: its sends among the last keep_last
  std::vector<char> retires_;  // and whether it retires any
  int rank_ = 0, size_ = 1;
};

struct ConnectedTransport {
  std::unique_ptr<Transport> transport;  // one entry's own when it reaches every peer, else a RoutedTransport
  // What each kind of hop uses: "shm" (one kind, one node), "shm within node (1 peer) + mpi across nodes (2 peers)",
  // "mpi (shm: DDPLAB_COMM_TRANSPORT=mpi)". say_where names the kind even for one kind on one node
  // ("shm within node (3 peers)").
  std::string description;
  ShmTransport* shm = nullptr;  // `transport`, when shared memory reaches every peer (the direct collectives)
  bool shm_hop = false;         // shared memory reaches some peer (its buffers can be registered: single copy)
};

// Collective over comm: every rank's peers routed through the table (tests pass their own).
ConnectedTransport connect_peers(MPI_Comm comm, const Topology& topology, const RingOptions& ring, bool say_where,
                                 const std::vector<HostTransportEntry>& table = host_transport_table());

}  // namespace ddplab
