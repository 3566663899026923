#include "comm/communicator.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <utility>

#include "comm/hier_allreduce.h"
#include "comm/link_emulation.h"
#include "comm/recursive_doubling.h"
#include "comm/ring_allreduce.h"
#include "comm/shm_direct.h"
#include "comm/transport_table.h"
#include "comm/wire.h"
#include "kernels/cpu/ops.h"
#include "runtime/mpi_check.h"
#include "runtime/settings.h"
#include "runtime/watchdog.h"

namespace ddplab {

namespace {

// One-way latency of a small message and per-direction bandwidth in Gb/s as the link is sold. Sources and
// reasoning in docs/COMM.md; they are round numbers for a model, not measurements of a particular cluster.
struct LinkPreset {
  const char* name;
  double latency_us;
  double gbps;
};
// clang-format off
constexpr LinkPreset kLinkPresets[] = {
    {"none",      0.0, 0},
    {"1gbe",     25.0, 1},     // 1 GbE with kernel TCP: the slow end of clusters built from office hardware
    {"10gbe",    10.0, 10},    // 10 GbE with kernel TCP: ~20 us round trip between MPI ranks
    {"25gbe",     5.0, 25},    // 25 GbE, RoCE or tuned TCP
    {"100gbe-ib", 1.5, 100},   // InfiniBand EDR, 100 Gb/s; MPI-level one-way latency
    {"pcie4",     2.0, 252},   // PCIe 4.0 x16: 16 GT/s x 16 lanes x 128/130 = 252 Gb/s per direction
    {"nvlink4",   1.0, 3600},  // H100 NVLink 4: 18 links x 25 GB/s = 450 GB/s per direction
    // What NCCL reaches over NVLink 4 on 8 x H100 (NVIDIA's published all_reduce_perf figures): ring bus bandwidth
    // ~370 GB/s, small messages ~6-20 us, i.e. ~1 us per ring step at 8 GPUs (14 steps).
    {"nvlink4-nccl", 1.0, 2960},
    // A node of 8 GPUs with one 400 Gb/s NDR InfiniBand NIC each, as the model's one link per node (8 x 400 Gb/s):
    // NCCL's rings cross nodes on all 8 NICs at once. ~4 us per step: NCCL's inter-node small-message latency.
    {"ndr400-x8",    4.0, 3200},
};
// clang-format on

}  // namespace

LinkModel parse_link(const std::string& preset, double latency_us_override, double gbps_override) {
  const LinkPreset* found = nullptr;
  for (const LinkPreset& p : kLinkPresets)
    if (preset == p.name) found = &p;
  if (!found) {
    std::string names;
    for (const LinkPreset& p : kLinkPresets)
      names += std::string(names.empty() ? "" : &p == std::end(kLinkPresets) - 1 ? " or " : ", ") + p.name;
    throw std::invalid_argument("unknown --link '" + preset + "' (expected " + names + ")");
  }
  LinkModel link{found->name, found->latency_us, found->gbps};
  // Negative keeps the preset's value; NaN and infinity are refused (NaN < 0 is false, so it reaches the check).
  if (latency_us_override >= 0 || std::isnan(latency_us_override)) {
    if (!std::isfinite(latency_us_override))
      throw std::invalid_argument("--link-latency-us must be a finite number >= 0, got " +
                                  std::to_string(latency_us_override));
    link.latency_us = latency_us_override;
  }
  if (gbps_override >= 0 || std::isnan(gbps_override)) {
    if (!std::isfinite(gbps_override))
      throw std::invalid_argument("--link-gbps must be a finite number >= 0, got " + std::to_string(gbps_override));
    link.gbps = gbps_override;
  }
  return link;
}

bool link_emulated(const LinkModel& link) { return link.gbps > 0 || link.latency_us > 0; }

std::string describe(const LinkModel& link) {
  if (!link_emulated(link)) return link.name;
  // Overrides on "none" make a link of their own: shown as such, never as "none". The name stays the preset's in
  // the data (run files, calibration files), where parse_link reads it back with the overrides beside it.
  const char* name = link.name == "none" ? "custom" : link.name.c_str();
  char text[128];
  if (link.gbps > 0)
    std::snprintf(text, sizeof text, "%s (%g us, %g Gbit/s)", name, link.latency_us, link.gbps);
  else
    std::snprintf(text, sizeof text, "%s (%g us, unlimited bandwidth)", name, link.latency_us);
  return text;
}

std::string describe(const LinkClasses& links) {
  return links.per_class() ? "intra " + describe(links.intra) + ", inter " + describe(links.inter)
                           : describe(links.intra);
}

LinkClasses parse_links(const std::string& spec, double latency_us_override, double gbps_override) {
  if (spec.find('=') == std::string::npos) return parse_link(spec, latency_us_override, gbps_override);
  if (latency_us_override >= 0 || gbps_override >= 0 || std::isnan(latency_us_override) || std::isnan(gbps_override))
    throw std::invalid_argument("--link-latency-us and --link-gbps apply to a single --link preset, not to --link " +
                                spec);
  LinkClasses links;
  bool seen[2] = {false, false};
  for (size_t pos = 0; pos <= spec.size();) {
    const size_t comma = std::min(spec.find(',', pos), spec.size());
    const std::string item = spec.substr(pos, comma - pos);
    const size_t eq = item.find('=');
    const std::string key = item.substr(0, eq);
    const int which = key == "intra" ? 0 : key == "inter" ? 1 : -1;
    if (eq == std::string::npos || which < 0)
      throw std::invalid_argument("unknown link class '" + key + "' in --link " + spec +
                                  " (expected intra=PRESET and/or inter=PRESET)");
    if (seen[which]) throw std::invalid_argument("--link " + spec + ": " + key + " given twice");
    seen[which] = true;
    try {
      (which ? links.inter : links.intra) = parse_link(item.substr(eq + 1));
    } catch (const std::invalid_argument& e) {
      throw std::invalid_argument("--link " + key + ": " + e.what());
    }
    pos = comma + 1;
  }
  return links;
}

// Default: the crossover measured on the development machine over shared memory (docs/COMM.md): 16 KiB at 2 ranks,
// 32 KiB beyond (the ring's 2(n-1) hops cost more latency as n grows). The direct all-reduce's fixed cost is lower
// than the ring's: at 2 ranks it wins from 4 KiB. Beyond 2 ranks it was measured oversubscribed only, where doubling
// still won to 32 KiB (the direct's rendezvous needs every rank on a core at once).
bool direct_allreduce_allowed(AllreduceImpl impl, WireDtype wire, const LinkClasses& link) {
  return impl == AllreduceImpl::kRing && wire == WireDtype::kFp32 && !link.emulated();
}

size_t small_allreduce_bytes(int n, bool direct) {
  const int64_t measured = n > 2    ? settings::kSmallAllreduceBytesBeyond
                           : direct ? settings::kSmallAllreduceBytesAtTwoRanksBesideDirect
                                    : settings::kSmallAllreduceBytesAtTwoRanks;
  return static_cast<size_t>(settings::integer(settings::kSmallAllreduceBytes, measured));
}

namespace {

// The tuning knobs (runtime/settings.h). Values are measured on the development machine, see docs/COMM.md.
size_t ring_slice_bytes() { return static_cast<size_t>(settings::integer(settings::kRingSliceBytes)); }
size_t ring_slices_per_chunk() { return static_cast<size_t>(settings::integer(settings::kRingSlicesPerChunk)); }

std::string str(int64_t x) { return std::to_string(x); }

}  // namespace

namespace {

// Each hop's link class from the topology (of the transport's communicator): within a node the intra link, per
// pair; across nodes the inter link, through this node's NIC.
std::unique_ptr<LinkEmulatedTransport> emulate_links(std::unique_ptr<Transport> t, const Topology& topology,
                                                     const LinkClasses& links, const std::shared_ptr<SharedNic>& nic) {
  std::vector<HopLink> hops;
  for (int p = 0; p < t->size(); ++p) {
    const bool across = !topology.same_node(t->rank(), p);
    const LinkModel& l = across ? links.inter : links.intra;
    hops.push_back({l.latency_us, l.gbps, across && nic});
  }
  return std::make_unique<LinkEmulatedTransport>(std::move(t), hops, nic);
}

// Where a description of hops (transport_table.h, hier's two of them joined by " + ") names shared memory as a kind of
// hop: at the start of a part, as "shm" or "shm within node"; never a refusal's "shm: ...". Where "single-copy" goes
// in the text; whether the hop is there at all the transports say (ConnectedTransport::shm_hop).
size_t shm_hop_in(const std::string& description) {
  for (size_t part = 0; part != std::string::npos;) {
    if (description.compare(part, 3, "shm") == 0 && (part + 3 == description.size() || description[part + 3] == ' '))
      return part;
    part = description.find(" + ", part);
    if (part != std::string::npos) part += 3;
  }
  return std::string::npos;
}

}  // namespace

std::unique_ptr<LinkEmulatedTransport> emulated_link_clock(MPI_Comm comm, const LinkClasses& links,
                                                           int ranks_per_node) {
  const Topology topology = detect_topology(comm, ranks_per_node);
  int rank = 0;
  mpiCheck(MPI_Comm_rank(comm, &rank));
  std::shared_ptr<SharedNic> nic;
  if (topology.nodes() > 1 && link_emulated(links.inter))
    nic = std::make_shared<SharedNic>(comm, topology.node_of_rank[rank]);
  return emulate_links(std::make_unique<MpiTransport>(comm), topology, links, nic);
}

std::optional<float16::Format> wire_format(WireDtype dtype) {
  switch (dtype) {
    case WireDtype::kFp32:
      return std::nullopt;
    case WireDtype::kBf16:
      return float16::Format::kBf16;
    case WireDtype::kFp16:
      return float16::Format::kFp16;
  }
  return std::nullopt;
}

RingOptions ring_options(WireDtype wire) {
  RingOptions ring;
  ring.slice_elems = ring_slice_bytes() / sizeof(float);
  ring.slices_per_chunk = ring_slices_per_chunk();
  ring.wire16 = wire_format(wire).has_value();
  ring.format = wire_format(wire).value_or(float16::Format::kBf16);
  return ring;
}

Communicator::Communicator(MPI_Comm comm, const CommOptions& options)
    : Communicator(comm, options, detect_topology(comm, options.ranks_per_node)) {}

Communicator::Communicator(MPI_Comm comm, const CommOptions& options, const Topology& topology)
    : comm_(comm), options_(options), topology_(topology) {
  mpiCheck(MPI_Comm_rank(comm_, &rank_));
  mpiCheck(MPI_Comm_size(comm_, &size_));
  if (options_.impl == AllreduceImpl::kNccl)
    throw std::invalid_argument("--comm nccl reduces GPU buffers (--device cuda), not a host Communicator's");
  if (options_.impl == AllreduceImpl::kMpi && options_.wire != WireDtype::kFp32)
    throw std::invalid_argument(std::string("--comm mpi has no ") + to_string(options_.wire) +
                                " wire (MPI_Allreduce sums fp32 buffers as fp32); use --comm ring for a 16-bit wire");
  if (options_.impl == AllreduceImpl::kHier && topology_.nodes() < 2)
    throw std::invalid_argument("--comm hier needs more than one node, and all " + str(size_) +
                                " ranks are on one (emulate nodes with --ranks-per-node K)");
  ring_ = ring_options(options_.wire);
  // Everything below is collective: every rank must construct its Communicator with the same options.
  if (options_.impl == AllreduceImpl::kMpi) {
    mpiCheck(MPI_Comm_dup(comm_, mpi_comm_.receive()));
    mpiCheck(MPI_Comm_set_errhandler(mpi_comm_, MPI_ERRORS_RETURN));
    transport_name_ = "MPI_Allreduce";
    return;
  }
  const bool emulated = options_.link.emulated();
  if (emulated && topology_.nodes() > 1 && link_emulated(options_.link.inter))
    nic_ = std::make_shared<SharedNic>(comm_, topology_.node_of_rank[rank_]);
  ShmTransport* shm = nullptr;  // the ring's transport, when shared memory reaches every peer unemulated
  bool shm_hop = false;         // shared memory reaches some peer
  if (options_.impl == AllreduceImpl::kHier) {
    HierAllreduce::WrapTransport wrap;
    if (emulated)
      wrap = [this](std::unique_ptr<Transport> t, const Topology& group) {
        return emulate_links(std::move(t), group, options_.link, nic_);
      };
    hier_ = std::make_unique<HierAllreduce>(comm_, topology_.node_of_rank[rank_], wrap);
    hops_ = hier_->transport_name();
    shm_hop = hier_->shm_hop();
  } else {
    ConnectedTransport connected = connect_peers(comm_, topology_, ring_, /*say_where=*/topology_.nodes() > 1);
    transport_ = std::move(connected.transport);
    hops_ = connected.description;
    shm_hop = connected.shm_hop;
    if (emulated)
      transport_ = emulate_links(std::move(transport_), topology_, options_.link, nic_);
    else
      shm = connected.shm;
  }
  single_copy_ = size_ > 1 && shm_hop && settings::integer(settings::kLocalRegister) == 1;
  // The direct all-reduce, where every rank can take it: ranks that disagreed (their DDPLAB_* settings differ) would
  // wait on boards and FIFOs, each for the other.
  int can_direct = options_.direct && direct_allreduce_allowed(options_.impl, options_.wire, options_.link) &&
                   single_copy_ && shm && shm->local_peers() == size_ - 1 &&
                   settings::integer(settings::kDirectAllreduce) == 1;
  mpiCheck(MPI_Allreduce(MPI_IN_PLACE, &can_direct, 1, MPI_INT, MPI_MIN, comm_));
  if (can_direct) direct_ = std::make_unique<DirectCollectives>(*shm);
  small_max_bytes_ = small_allreduce_bytes(size_, direct());
  name_transport();
}

// Ends a transport's name where registered buffers take the direct collectives.
constexpr const char* kDirectCollectives = " + direct collectives";

bool names_direct_collectives(const std::string& transport_name) {
  return transport_name.find(kDirectCollectives) != std::string::npos;
}

// From what the collectives use, so that the description cannot disagree with them.
void Communicator::name_transport() {
  transport_name_ = hops_;
  if (const size_t at = shm_hop_in(transport_name_); single_copy_ && at != std::string::npos)
    transport_name_.insert(at + 3, " single-copy");
  if (options_.link.emulated()) transport_name_ += " + link emulation";
  if (direct_) transport_name_ += kDirectCollectives;
  if (registration_failed_) transport_name_ += " (copies: registering the buffers failed)";
}

RegisteredBuffer Communicator::allocate_registered(size_t bytes) {
  RegisteredBuffer buffer(comm_, bytes, single_copy_);
  if (!buffer.registration_error().empty()) {  // on every rank of this host alike
    std::fprintf(stderr, "ddplab: %s; the buffers go by copy instead\n", buffer.registration_error().c_str());
    // The buffers after it too: all by copy, or the host's ranks could differ. Direct collectives would only find
    // unregistered buffers and pass them to the ring, after a rendezvous per call; they run where every rank is on
    // this host, so all of comm drops them here together.
    single_copy_ = false;
    direct_.reset();
    small_max_bytes_ = small_allreduce_bytes(size_, direct());
    registration_failed_ = true;
    name_transport();
  }
  return buffer;
}

Communicator::~Communicator() = default;

void Communicator::allreduce_sum(float* data, size_t count, int tag) { allreduce(data, data, count, tag, 1.0f, false); }

void Communicator::allreduce_sum_into(const float* in, float* out, size_t count, int tag) {
  allreduce(in, out, count, tag, 1.0f, false);
}

bool Communicator::allreduce_gradients(float* data, size_t count, float scale, int tag) {
  return allreduce(data, data, count, tag, scale, true);
}

template <typename Op>
auto Communicator::guarded(const char* what, const char* waiting_in, int tag, Op op) {
  if (!failed_.empty())
    throw std::runtime_error("rank " + str(rank_) + ": Communicator unusable after an earlier failure (" + failed_ +
                             ")");
  if (tag < 0 || tag > kMaxTag)
    throw std::invalid_argument("rank " + str(rank_) + ": " + what + " tag " + str(tag) + " outside [0, " +
                                str(kMaxTag) + "]");
  const watchdog::Wait wait(waiting_in, -1, tag);
  try {
    return op();
  } catch (const TagMismatch& e) {
    failed_ = std::string(what) + " order mismatch";
    throw std::runtime_error("rank " + str(rank_) + ": " + what + " order mismatch: this rank runs tag " + str(tag) +
                             ", rank " + str(e.peer) + " sent tag " + str(e.received_tag) +
                             " (ranks started their collectives in different orders)");
  } catch (const std::exception& e) {
    failed_ = e.what();
    throw;
  }
}

bool Communicator::allreduce(const float* in, float* out, size_t count, int tag, float scale, bool check_finite) {
  return guarded("all-reduce", options_.impl == AllreduceImpl::kMpi ? "MPI_Allreduce" : "all-reduce", tag, [&] {
    if (ring_.wire16 && wire::scales_before_sum(ring_.format) && scale != 1.0f) {
      if (in != out) std::memcpy(out, in, count * sizeof(float));
      cpu::scale(out, scale, static_cast<int64_t>(count));
      in = out;
      scale = 1.0f;
    }
    RingOptions o = ring_;
    o.tag = tag;
    if (options_.impl == AllreduceImpl::kMpi) {
      mpi_allreduce_sum(in, out, count, tag);
    } else if (hier_) {
      hier_->allreduce_sum(in, out, count, o);
    } else if (small(count)) {
      if (in != out) std::memcpy(out, in, count * sizeof(float));  // small: the copy costs next to nothing
      recursive_doubling_allreduce_sum(out, count, *transport_, scratch_, o);
    } else if (!o.wire16) {  // the flat ring: the epilogue where each value becomes final
      o.final_scale = scale;
      o.check_finite = check_finite;
      if (direct_) {  // the ring's result, bit for bit, where every rank's buffers are registered
        if (const std::optional<bool> finite = direct_->run(DirectCollectives::Kind::kAllreduce, in, out, count, o))
          return *finite;
      }
      return ring_allreduce_sum(in, out, count, *transport_, scratch_, o);
    } else {
      ring_allreduce_sum(in, out, count, *transport_, scratch_, o);
    }
    return epilogue_pass(out, count, scale, check_finite);
  });
}

// The sharded update cuts buffers as the flat ring does, so that what a rank owns is what its reduce-scatter finishes.
void Communicator::require_sharded_ring() const {
  if (options_.impl != AllreduceImpl::kRing || hier_ || ring_.wire16)
    throw std::logic_error("the sharded update needs --comm ring on the fp32 wire");
}

bool Communicator::small(size_t count) const { return count * sizeof(float) <= small_max_bytes_; }

// A buffer the all-reduce gives to recursive doubling is all-reduced whole instead, and every rank owns all of it:
// latency bounds it, not bytes, and the sums keep the all-reduce's order, so the sharded update stays bitwise equal.
bool Communicator::sharded(size_t count) const { return size_ > 1 && !small(count); }

std::vector<RingChunk> Communicator::owned_chunks(size_t count) const {
  require_sharded_ring();
  if (!sharded(count)) return {RingChunk{0, count}};
  return ring_owned_chunks(count, size_, rank_, ring_);
}

bool Communicator::reduce_scatter_gradients(float* data, size_t count, float scale, int tag) {
  require_sharded_ring();
  if (!sharded(count)) return allreduce_gradients(data, count, scale, tag);
  return guarded("reduce-scatter", "reduce-scatter", tag, [&] {
    RingOptions o = ring_;
    o.tag = tag;
    o.final_scale = scale;
    o.check_finite = true;
    if (direct_) {  // the ring's owned sums, bit for bit, where every rank's buffer is registered
      if (const std::optional<bool> finite =
              direct_->run(DirectCollectives::Kind::kReduceScatter, data, data, count, o))
        return *finite;
    }
    return ring_reduce_scatter_sum(data, count, *transport_, scratch_, o);
  });
}

void Communicator::all_gather(float* data, size_t count, int tag) {
  require_sharded_ring();
  if (!sharded(count)) return;  // every rank owns it all
  guarded("all-gather", "all-gather", tag, [&] {
    RingOptions o = ring_;
    o.tag = tag;
    if (direct_ && direct_->run(DirectCollectives::Kind::kAllGather, data, data, count, o)) return;
    ring_all_gather_owned(data, count, *transport_, scratch_, o);
  });
}

void Communicator::check_same_operation_everywhere(size_t count, int tag) {
  // MAXLOC over {tag, -tag, count, -count} gives every rank the largest and smallest tag and count and a rank
  // holding each, in one small all-reduce; every rank sees the same answer, so all throw together.
  struct LongInt {
    long value;
    int rank;
  };
  const long c = static_cast<long>(count);
  LongInt mine[4] = {{tag, rank_}, {-long{tag}, rank_}, {c, rank_}, {-c, rank_}}, all[4];
  mpiCheck(MPI_Allreduce(mine, all, 4, MPI_LONG_INT, MPI_MAXLOC, mpi_comm_));
  auto other = [&](int i, long own) -> std::pair<long, int> {  // the extreme that differs from ours, if any
    if (all[i].value != own) return {all[i].value, all[i].rank};
    return {-all[i + 1].value, all[i + 1].rank};
  };
  if (all[0].value != -all[1].value) {
    const auto [t, r] = other(0, tag);
    throw TagMismatch(rank_, r, tag, static_cast<int>(t));
  }
  if (all[2].value != -all[3].value) {
    const auto [n, r] = other(2, c);
    throw std::runtime_error("rank " + str(rank_) + ": all-reduce size mismatch on tag " + str(tag) +
                             ": this rank has " + str(c) + " elements, rank " + str(r) + " has " + str(n));
  }
}

void Communicator::mpi_allreduce_sum(const float* in, float* out, size_t count, int tag) {
  const int64_t start = monotonic_ns();
  check_same_operation_everywhere(count, tag);
  // MPI counts are int: larger buffers go in INT_MAX-element pieces (elementwise, so pieces are independent).
  for (size_t offset = 0; offset < count;) {
    const int piece = static_cast<int>(std::min(count - offset, static_cast<size_t>(INT_MAX)));
    mpiCheck(MPI_Allreduce(in == out ? MPI_IN_PLACE : in + offset, out + offset, piece, MPI_FLOAT, MPI_SUM, mpi_comm_));
    offset += piece;
  }
  // Link emulation for a library collective we cannot see inside: a model, not a measurement. The call takes at
  // least as long as a bandwidth-optimal ring would on the link, 2(n-1) steps of latency + (bytes/n)/bandwidth;
  // across nodes the ring's slowest hop is the inter link (ranks in order: one stream per NIC, no sharing).
  const LinkModel& link = topology_.nodes() > 1 ? options_.link.inter : options_.link.intra;
  if (link_emulated(link) && size_ > 1) {
    const double step_ns =
        link.latency_us * 1e3 + (link.gbps > 0 ? count * sizeof(float) / double(size_) * 8.0 / link.gbps : 0.0);
    sleep_until_ns(start + static_cast<int64_t>(2.0 * (size_ - 1) * step_ns));
  }
}

}  // namespace ddplab
