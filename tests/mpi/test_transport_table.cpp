// The transport table (comm/transport_table.h): each peer takes the first entry that can connect to it, a refusal
// and a failed setup keep their reasons in the description, an entry nobody needs is never set up, and the routed
// transport retires each transport's share of the oldest sends. ctest runs it at np 3, also with
// DDPLAB_COMM_TRANSPORT=mpi.
#include <gtest/gtest.h>
#include <mpi.h>

#include <atomic>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "comm/shm_transport.h"
#include "comm/topology.h"
#include "comm/transport_table.h"
#include "runtime/settings.h"
#include "tests/mpi/mpi_test_util.h"

namespace ddplab {
namespace {

bool mpi_forced() { return settings::choice(settings::kCommTransport) == "mpi"; }

// Every rank sends its rank, tagged by the receiver, to every peer, and checks what each peer sent it.
void exchange_with_every_peer(Transport& t) {
  const int rank = t.rank(), n = t.size();
  std::vector<int> out(n, rank), in(n, -1);
  for (int p = 0; p < n; ++p)
    if (p != rank) t.send(p, &out[p], sizeof(int), p);
  for (int p = 0; p < n; ++p)
    if (p != rank) t.recv(p, &in[p], sizeof(int), rank);
  t.wait_sends();
  for (int p = 0; p < n; ++p) {
    if (p == rank) continue;
    EXPECT_EQ(in[p], p) << "from rank " << p;
  }
}

// The last rank on a node of its own, the others on one node: shared memory within, MPI across.
TEST(TransportTable, EachPeerTakesTheFirstEntryThatConnects) {
  const int n = world_size(), rank = world_rank();
  if (n < 3) GTEST_SKIP() << "needs a node of 2+ ranks beside another node";
  std::vector<int> ids(n, 0);
  ids[n - 1] = 1;
  const Topology topology = topology_from_ids(ids);
  ConnectedTransport connected = connect_peers(MPI_COMM_WORLD, topology, RingOptions{}, /*say_where=*/true);
  const std::string within = std::to_string(n - 2) + (n - 2 == 1 ? " peer" : " peers");
  std::string want;
  if (rank == n - 1)
    want = "mpi across nodes (" + std::to_string(n - 1) + " peers)";
  else if (mpi_forced())
    want = "mpi within node (" + within + "; shm: DDPLAB_COMM_TRANSPORT=mpi) + mpi across nodes (1 peer)";
  else
    want = "shm within node (" + within + ") + mpi across nodes (1 peer)";
  EXPECT_EQ(connected.description, want);
  EXPECT_EQ(connected.shm, nullptr) << "shared memory does not reach every peer";
  exchange_with_every_peer(*connected.transport);
}

// Every rank on a node of its own: no peer is on shared memory, so no rank sets it up for itself alone (a segment in
// /dev/shm, and a progress() of it at every poll of MPI); MPI serves every peer, as the one transport.
TEST(TransportTable, NoSharedMemoryWhereNoPeerSharesTheNode) {
  const int n = world_size();
  if (n < 2) GTEST_SKIP() << "needs peers";
  std::vector<int> ids(n);
  for (int r = 0; r < n; ++r) ids[r] = r;
  ConnectedTransport connected = connect_peers(MPI_COMM_WORLD, topology_from_ids(ids), RingOptions{}, true);
  EXPECT_EQ(connected.description, "mpi across nodes (" + std::to_string(n - 1) + (n == 2 ? " peer)" : " peers)"));
  EXPECT_NE(dynamic_cast<MpiTransport*>(connected.transport.get()), nullptr)
      << "MPI alone, not beside a shared-memory transport that no peer uses";
  exchange_with_every_peer(*connected.transport);
}

TEST(TransportTable, OneNodeTakesSharedMemoryAloneOrSaysWhyNot) {
  const int n = world_size();
  const Topology topology = topology_from_ids(std::vector<int>(n, 0));
  ConnectedTransport connected = connect_peers(MPI_COMM_WORLD, topology, RingOptions{}, /*say_where=*/false);
  EXPECT_EQ(connected.description, mpi_forced() ? "mpi (shm: DDPLAB_COMM_TRANSPORT=mpi)" : "shm");
  EXPECT_EQ(connected.shm != nullptr, !mpi_forced());
  exchange_with_every_peer(*connected.transport);
}

std::atomic<int> never_setups{0};

// A first entry that connects every pair of a node but cannot be built: the pairs go on to MPI, saying why.
TEST(TransportTable, ASetupThatFailsIsNamedAndTheNextEntryServes) {
  const int n = world_size();
  const std::vector<HostTransportEntry> table = {
      {"never", [](const PeerQuery&, int, int) { return std::string("not for anyone"); },
       [](MPI_Comm, const PeerQuery&) -> std::unique_ptr<Transport> {
         ++never_setups;
         return nullptr;
       }},
      {"broken", [](const PeerQuery&, int, int) { return std::string(); },
       [](MPI_Comm, const PeerQuery&) -> std::unique_ptr<Transport> { throw std::runtime_error("no room"); }},
      host_transport_table().back(),
  };
  const Topology topology = topology_from_ids(std::vector<int>(n, 0));
  ConnectedTransport connected = connect_peers(MPI_COMM_WORLD, topology, RingOptions{}, /*say_where=*/false, table);
  EXPECT_EQ(connected.description, "mpi (never: not for anyone; broken: setup failed: no room)");
  EXPECT_EQ(never_setups.load(), 0) << "an entry that connects no pair on any rank is never set up";
  exchange_with_every_peer(*connected.transport);
}

// Records the calls a RoutedTransport makes; sends complete when wait_sends retires them.
class RecordingTransport final : public Transport {
 public:
  RecordingTransport(int rank, int size, std::vector<std::string>& log, std::string name)
      : rank_(rank), size_(size), log_(log), name_(std::move(name)) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void send(int peer, const void*, size_t, int) override {
    log_.push_back(name_ + " send " + std::to_string(peer));
    ++in_flight_;
  }
  void recv(int peer, void*, size_t, int) override { log_.push_back(name_ + " recv " + std::to_string(peer)); }
  void wait_sends(size_t keep_last) override {
    log_.push_back(name_ + " wait_sends " + std::to_string(keep_last) + " of " + std::to_string(in_flight_));
    in_flight_ = std::min(in_flight_, keep_last);
  }

 private:
  int rank_, size_;
  size_t in_flight_ = 0;
  std::vector<std::string>& log_;
  std::string name_;
};

TEST(RoutedTransport, RetiresEachTransportsShareOfTheOldestSends) {
  std::vector<std::string> log;
  std::vector<std::unique_ptr<Transport>> transports;
  transports.push_back(std::make_unique<RecordingTransport>(0, 3, log, "a"));
  transports.push_back(std::make_unique<RecordingTransport>(0, 3, log, "b"));
  RoutedTransport routed(std::move(transports), {0, 0, 1});  // rank 1 through a, rank 2 through b
  int x = 0;
  routed.send(1, &x, sizeof x, 0);
  routed.send(2, &x, sizeof x, 0);
  routed.send(1, &x, sizeof x, 0);
  routed.send(2, &x, sizeof x, 0);
  routed.recv(2, &x, sizeof x, 0);
  routed.wait_sends(3);  // the oldest (a's first) retires: a keeps 1, b keeps its 2, so b is not asked
  routed.wait_sends(1);  // b's first and a's second retire: a keeps 0, b keeps 1
  routed.wait_sends(1);  // nothing older than the last one is left
  routed.wait_sends();
  const std::vector<std::string> want = {"a send 1",
                                         "b send 2",
                                         "a send 1",
                                         "b send 2",
                                         "b recv 2",
                                         "a wait_sends 1 of 2",
                                         "a wait_sends 0 of 1",
                                         "b wait_sends 1 of 2",
                                         "b wait_sends 0 of 1"};
  EXPECT_EQ(log, want);
  EXPECT_THROW(routed.send(3, &x, sizeof x, 0), std::invalid_argument);
}

}  // namespace
}  // namespace ddplab
