#include "comm/topology.h"

#include <algorithm>
#include <cstdio>
#include <stdexcept>

#include "runtime/mpi_check.h"
#include "runtime/settings.h"
#include "comm/shm_transport.h"

namespace ddplab {

int Topology::nodes() const {
  return node_of_rank.empty() ? 0 : *std::max_element(node_of_rank.begin(), node_of_rank.end()) + 1;
}

std::vector<int> Topology::node_sizes() const {
  std::vector<int> sizes(nodes(), 0);
  for (int node : node_of_rank) ++sizes[node];
  return sizes;
}

std::string Topology::describe() const {
  const std::vector<int> sizes = node_sizes();
  const bool equal = std::count(sizes.begin(), sizes.end(), sizes[0]) == static_cast<long>(sizes.size());
  std::string text = std::to_string(sizes.size()) + (sizes.size() == 1 ? " node" : " nodes");
  if (sizes.size() > 1 && equal) text += " x " + std::to_string(sizes[0]) + (sizes[0] == 1 ? " rank" : " ranks");
  if (!equal) {
    text += " of";
    for (size_t i = 0; i < sizes.size(); ++i) text += (i ? ", " : " ") + std::to_string(sizes[i]);
    text += " ranks";
  }
  return text + (emulated() ? " (emulated)" : "");
}

Topology topology_from_ids(const std::vector<int>& node_ids, int ranks_per_node) {
  Topology t;
  t.ranks_per_node = ranks_per_node;
  std::vector<int> seen;  // ids in order of first appearance: their index is the node's number
  for (int id : node_ids) {
    auto it = std::find(seen.begin(), seen.end(), id);
    if (it == seen.end()) it = seen.insert(seen.end(), id);
    t.node_of_rank.push_back(static_cast<int>(it - seen.begin()));
  }
  return t;
}

Topology detect_topology(MPI_Comm comm, int ranks_per_node) {
  int rank = 0, size = 1;
  mpiCheck(MPI_Comm_rank(comm, &rank));
  mpiCheck(MPI_Comm_size(comm, &size));
  if (ranks_per_node < 0 || (ranks_per_node > 0 && size % ranks_per_node != 0))
    throw std::invalid_argument("--ranks-per-node " + std::to_string(ranks_per_node) + " does not divide the " +
                                std::to_string(size) + " ranks into equal nodes");
  std::vector<int> ids(size);
  if (ranks_per_node > 0) {
    for (int r = 0; r < size; ++r) ids[r] = r / ranks_per_node;
    return topology_from_ids(ids, ranks_per_node);
  }
  // A host is named by its lowest rank in comm.
  MPI_Comm host;
  int lowest = 0;
  mpiCheck(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &host));
  mpiCheck(MPI_Allreduce(&rank, &lowest, 1, MPI_INT, MPI_MIN, host));
  mpiCheck(MPI_Comm_free(&host));
  mpiCheck(MPI_Allgather(&lowest, 1, MPI_INT, ids.data(), 1, MPI_INT, comm));
  return topology_from_ids(ids);
}

namespace {

std::string peers(int n) { return std::to_string(n) + (n == 1 ? " peer)" : " peers)"); }

}  // namespace

std::string describe_hops(const Topology& topology, const Transport& transport, bool say_where) {
  const auto* shm = dynamic_cast<const ShmTransport*>(&transport);
  const int rank = transport.rank();
  int by_shm = 0, mpi_within = 0, mpi_across = 0;
  for (int p = 0; p < topology.size(); ++p) {
    if (p == rank) continue;
    if (shm && shm->through_shm(p))
      ++by_shm;
    else if (topology.same_node(p, rank))
      ++mpi_within;
    else
      ++mpi_across;
  }
  if (!say_where && mpi_across == 0 && (by_shm == 0 || mpi_within == 0)) return shm ? "shm" : "mpi";  // one kind
  std::string name;
  const auto add = [&](int n, const char* what) {
    if (n) name += (name.empty() ? "" : " + ") + std::string(what) + " (" + peers(n);
  };
  add(by_shm, "shm within node");
  add(mpi_within, "mpi within node");
  add(mpi_across, "mpi across nodes");
  return name.empty() ? "none (one rank)" : name;
}

std::unique_ptr<Transport> connect_transport(MPI_Comm comm, const Topology& topology, const RingOptions& ring,
                                             std::string& name) {
  int rank = 0;
  mpiCheck(MPI_Comm_rank(comm, &rank));
  if (settings::choice(settings::kCommTransport) == "shm") {
    try {
      // Room for a step's K slices plus one, so a step's sends go out at once (eagerly).
      const size_t fifo = std::max(ShmTransport::kDefaultFifoBytes,
                                   (ring.slices_per_chunk + 1) * ring.slice_elems * sizeof(float));
      auto shm = std::make_unique<ShmTransport>(comm, topology.node_of_rank, fifo);
      name = describe_hops(topology, *shm, topology.nodes() > 1);
      return shm;
    } catch (const std::runtime_error& e) {  // agreed on by every rank of a node, so all take MPI alike
      if (rank == 0) std::fprintf(stderr, "ddplab: shared memory did not connect (%s); using MPI\n", e.what());
    }
  }
  auto mpi = std::make_unique<MpiTransport>(comm);
  name = describe_hops(topology, *mpi, topology.nodes() > 1);
  return mpi;
}

}  // namespace ddplab
