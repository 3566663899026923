#include "comm/transport_table.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <set>
#include <stdexcept>
#include <utility>

#include "comm/shm_transport.h"
#include "runtime/mpi_check.h"
#include "runtime/settings.h"

namespace ddplab {

namespace {

std::string shm_cannot_connect(const PeerQuery& q, int from, int to) {
  if (settings::choice(settings::kCommTransport) == "mpi") return "DDPLAB_COMM_TRANSPORT=mpi";
  if (!q.topology.same_node(from, to)) return "another node";
  if (q.host_of_rank[from] != q.host_of_rank[to]) return "another host";
  return "";
}

std::unique_ptr<Transport> shm_setup(MPI_Comm comm, const PeerQuery& q) {
  // Room for a ring step's K slices plus one, so a step's sends go out at once (eagerly).
  const size_t fifo =
      std::max(ShmTransport::kDefaultFifoBytes, (q.ring.slices_per_chunk + 1) * q.ring.slice_elems * sizeof(float));
  return std::make_unique<ShmTransport>(comm, q.topology.node_of_rank, fifo);
}

std::string mpi_cannot_connect(const PeerQuery&, int, int) { return ""; }

std::unique_ptr<Transport> mpi_setup(MPI_Comm comm, const PeerQuery&) { return std::make_unique<MpiTransport>(comm); }

std::string peers(int n) { return std::to_string(n) + (n == 1 ? " peer" : " peers"); }

// One kind of hop: the peers one entry reaches within this rank's node or across it, and why earlier entries
// did not reach them.
struct HopKind {
  int peers = 0;
  std::set<std::string> refused;  // "shm: another host"
};

std::string describe(const std::vector<HostTransportEntry>& table, const Topology& topology, int rank,
                     const std::vector<int>& route, const std::vector<std::string>& refused, bool say_where) {
  std::map<std::pair<int, bool>, HopKind> kinds;  // by (entry, across nodes): table order, within first
  for (int p = 0; p < topology.size(); ++p) {
    if (p == rank) continue;
    const bool across = !topology.same_node(rank, p);
    HopKind& kind = kinds[{route[p], across}];
    ++kind.peers;
    // Across nodes only the table's later entries ever connect: a reader expects no reason there.
    if (!across && !refused[p].empty()) kind.refused.insert(refused[p]);
  }
  const auto reasons = [](const HopKind& kind) {
    std::string text;
    for (const std::string& r : kind.refused) text += (text.empty() ? "" : "; ") + r;
    return text;
  };
  const bool one_kind_on_one_node = kinds.size() <= 1 && (kinds.empty() || !kinds.begin()->first.second);
  if (!say_where && one_kind_on_one_node) {
    // No peer at all: the entry this rank reaches itself through, as a peer of its own host would be.
    const HopKind self{0, refused[rank].empty() ? std::set<std::string>{} : std::set<std::string>{refused[rank]}};
    const int entry = kinds.empty() ? route[rank] : kinds.begin()->first.first;
    const std::string why = reasons(kinds.empty() ? self : kinds.begin()->second);
    return table[entry].name + (why.empty() ? "" : " (" + why + ")");
  }
  std::string text;
  for (const auto& [key, kind] : kinds) {
    const std::string why = reasons(kind);
    text += (text.empty() ? "" : " + ") + std::string(table[key.first].name) +
            (key.second ? " across nodes (" : " within node (") + peers(kind.peers) + (why.empty() ? "" : "; " + why) +
            ")";
  }
  return text.empty() ? "none (one rank)" : text;
}

}  // namespace

const std::vector<HostTransportEntry>& host_transport_table() {
  static const std::vector<HostTransportEntry> table = {
      {"shm", shm_cannot_connect, shm_setup},
      {"mpi", mpi_cannot_connect, mpi_setup},
  };
  return table;
}

RoutedTransport::RoutedTransport(std::vector<std::unique_ptr<Transport>> transports, std::vector<int> route)
    : transports_(std::move(transports)),
      route_(std::move(route)),
      keep_(transports_.size(), 0),
      retires_(transports_.size(), 0) {
  for (size_t t = 0; t < transports_.size(); ++t) {
    if (!transports_[t]) continue;
    rank_ = transports_[t]->rank();
    size_ = transports_[t]->size();
    transports_[t]->set_while_waiting([this, t] {
      waiting();  // this transport's own hook, as set by its owner
      for (size_t other = 0; other < transports_.size(); ++other)
        if (other != t && transports_[other]) transports_[other]->progress();
    });
  }
  if (static_cast<int>(route_.size()) != size_)
    throw std::logic_error("RoutedTransport: a route per rank expected, got " + std::to_string(route_.size()));
}

Transport& RoutedTransport::to(int peer) {
  if (peer < 0 || peer >= size_)
    throw std::invalid_argument("rank " + std::to_string(rank_) + ": peer " + std::to_string(peer) +
                                " outside the communicator of " + std::to_string(size_) + " ranks");
  return *transports_[route_[peer]];
}

void RoutedTransport::send(int peer, const void* buf, size_t bytes, int tag) {
  to(peer).send(peer, buf, bytes, tag);
  started_.push_back(route_[peer]);
}

void RoutedTransport::recv(int peer, void* buf, size_t bytes, int tag) { to(peer).recv(peer, buf, bytes, tag); }

void RoutedTransport::recv_consume(int peer, size_t bytes, int tag, void* staging, const Consume& consume) {
  to(peer).recv_consume(peer, bytes, tag, staging, consume);
}

void RoutedTransport::wait_sends(size_t keep_last) {
  if (started_.size() <= keep_last) return;
  // The ring calls this every step: the counts live in members, sized once, so no step allocates.
  std::fill(keep_.begin(), keep_.end(), 0);  // each transport's sends among the last keep_last
  std::fill(retires_.begin(), retires_.end(), 0);
  const auto retire_end = started_.end() - static_cast<std::ptrdiff_t>(keep_last);
  for (auto it = retire_end; it != started_.end(); ++it) ++keep_[*it];
  for (auto it = started_.begin(); it != retire_end; ++it) retires_[*it] = 1;
  for (size_t t = 0; t < transports_.size(); ++t)
    if (retires_[t]) transports_[t]->wait_sends(keep_[t]);
  started_.erase(started_.begin(), retire_end);
}

bool RoutedTransport::progress() {
  bool in_flight = false;
  for (const std::unique_ptr<Transport>& t : transports_)
    if (t && t->progress()) in_flight = true;
  return in_flight;
}

ConnectedTransport connect_peers(MPI_Comm comm, const Topology& topology, const RingOptions& ring, bool say_where,
                                 const std::vector<HostTransportEntry>& table) {
  int rank = 0, size = 1;
  mpiCheck(MPI_Comm_rank(comm, &rank));
  mpiCheck(MPI_Comm_size(comm, &size));
  const std::vector<int> hosts = host_of_rank(comm);
  const PeerQuery q{topology, hosts, ring};
  // Every peer; the rank itself only when it has none (it still needs a transport, the one a peer of its host would
  // take). With peers it goes the way of one of them: routed on its own, it would set up a transport (a shared-memory
  // segment) that no peer uses.
  std::vector<int> route(size, -1);
  std::vector<std::string> refused(size);  // per rank: why the entries before its route did not connect
  std::vector<std::unique_ptr<Transport>> transports(table.size());
  const auto refuse = [&](int p, const HostTransportEntry& e, const std::string& why) {
    refused[p] += (refused[p].empty() ? "" : "; ") + std::string(e.name) + ": " + why;
  };
  for (size_t e = 0; e < table.size(); ++e) {
    std::vector<int> mine;
    for (int p = 0; p < size; ++p) {
      if (route[p] >= 0 || (p == rank && size > 1)) continue;
      const std::string why = table[e].cannot_connect(q, rank, p);
      if (why.empty())
        mine.push_back(p);
      else
        refuse(p, table[e], why);
    }
    int wanted = !mine.empty(), anyone = 0;  // the setup is collective: all ranks set it up, or none
    mpiCheck(MPI_Allreduce(&wanted, &anyone, 1, MPI_INT, MPI_MAX, comm));
    if (!anyone) continue;
    try {
      transports[e] = table[e].setup(comm, q);
    } catch (const std::runtime_error& err) {  // agreed on by both ends of each pair it would have served
      if (!mine.empty())
        std::fprintf(stderr, "ddplab: rank %d: %s did not connect (%s); the next transport serves instead\n", rank,
                     table[e].name, err.what());
      for (int p : mine) refuse(p, table[e], std::string("setup failed: ") + err.what());
      continue;
    }
    for (int p : mine) route[p] = static_cast<int>(e);
  }
  if (size > 1) route[rank] = route[(rank + 1) % size];
  for (int p = 0; p < size; ++p)
    if (route[p] < 0)
      throw std::runtime_error("rank " + std::to_string(rank) + ": no transport reaches rank " + std::to_string(p) +
                               " (" + refused[p] + ")");

  ConnectedTransport connected;
  connected.description = describe(table, topology, rank, route, refused, say_where);
  for (int p = 0; p < size; ++p)
    connected.shm_hop |= p != rank && dynamic_cast<ShmTransport*>(transports[route[p]].get()) != nullptr;
  const bool one_entry = std::count(route.begin(), route.end(), route[0]) == size;
  const bool nothing_else =
      std::count_if(transports.begin(), transports.end(), [](const auto& t) { return t != nullptr; }) == 1;
  if (one_entry && nothing_else) {
    connected.transport = std::move(transports[route[0]]);
    connected.shm = dynamic_cast<ShmTransport*>(connected.transport.get());
  } else {
    connected.transport = std::make_unique<RoutedTransport>(std::move(transports), std::move(route));
  }
  return connected;
}

}  // namespace ddplab
