#include "comm/communicator.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <utility>

#include "comm/link_emulation.h"
#include "comm/settings.h"
#include "comm/mpi_check.h"
#include "comm/recursive_doubling.h"
#include "comm/ring_allreduce.h"
#include "comm/shm_transport.h"
#include "comm/watchdog.h"
#include "kernels/cpu/ops.h"

namespace ddplab {

AllreduceImpl parse_allreduce_impl(const std::string& name) {
  if (name == "ring") return AllreduceImpl::kRing;
  if (name == "mpi") return AllreduceImpl::kMpi;
  throw std::invalid_argument("unknown --comm '" + name + "' (expected ring, mpi, or nccl with --device cuda)");
}

const char* to_string(AllreduceImpl impl) {
  switch (impl) {
    case AllreduceImpl::kRing:
      return "ring";
    case AllreduceImpl::kMpi:
      return "mpi";
  }
  return "?";
}

WireDtype parse_wire_dtype(const std::string& name) {
  if (name == "fp32") return WireDtype::kFp32;
  if (name == "bf16") return WireDtype::kBf16;
  if (name == "fp16") return WireDtype::kFp16;
  throw std::invalid_argument("unknown wire dtype '" + name + "' (expected fp32, bf16 or fp16)");
}

const char* to_string(WireDtype dtype) {
  switch (dtype) {
    case WireDtype::kFp32:
      return "fp32";
    case WireDtype::kBf16:
      return "bf16";
    case WireDtype::kFp16:
      return "fp16";
  }
  return "?";
}

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
    {"10gbe",    10.0, 10},    // 10 GbE with kernel TCP: ~20 us round trip between MPI ranks
    {"25gbe",     5.0, 25},    // 25 GbE, RoCE or tuned TCP
    {"100gbe-ib", 1.5, 100},   // InfiniBand EDR, 100 Gb/s; MPI-level one-way latency
    {"pcie4",     2.0, 252},   // PCIe 4.0 x16: 16 GT/s x 16 lanes x 128/130 = 252 Gb/s per direction
    {"nvlink4",   1.0, 3600},  // H100 NVLink 4: 18 links x 25 GB/s = 450 GB/s per direction
};
// clang-format on

}  // namespace

LinkModel parse_link(const std::string& preset, double latency_us_override, double gbps_override) {
  const LinkPreset* found = nullptr;
  for (const LinkPreset& p : kLinkPresets)
    if (preset == p.name) found = &p;
  if (!found)
    throw std::invalid_argument("unknown --link '" + preset +
                                "' (expected none, 10gbe, 25gbe, 100gbe-ib, pcie4 or nvlink4)");
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

// Default: the crossover measured on the development machine over shared memory (docs/COMM.md): 16 KiB at 2 ranks,
// 32 KiB beyond (the ring's 2(n-1) hops cost more latency as n grows).
size_t small_allreduce_bytes(int n) {
  const int64_t measured = n <= 2 ? int64_t{16} << 10 : int64_t{32} << 10;
  return static_cast<size_t>(settings::integer(settings::kSmallAllreduceBytes, measured, 0, int64_t{1} << 40));
}

namespace {

// The tuning knobs (comm/settings.h). Values are measured on the development machine, see docs/COMM.md.
size_t ring_slice_bytes() {
  return static_cast<size_t>(settings::integer(settings::kRingSliceBytes, 0, int64_t{1} << 40));
}
size_t ring_slices_per_chunk() {
  return static_cast<size_t>(settings::integer(settings::kRingSlicesPerChunk, 1, 1 << 20));
}
std::string comm_transport() { return settings::choice(settings::kCommTransport, {"shm", "mpi"}); }

bool link_emulated(const LinkModel& link) { return link.gbps > 0 || link.latency_us > 0; }

std::string str(int64_t x) { return std::to_string(x); }

}  // namespace

namespace {

// The ring's transports in order of preference, in NCCL's manner: each is tried in turn, and the first that connects
// on every rank wins (a connect is collective and fails on every rank alike). DDPLAB_COMM_TRANSPORT=mpi starts the
// list at mpi. A transport that cannot connect is never skipped silently: rank 0 says which and why.
struct RingTransportOption {
  const char* name;
  // Collective; throws std::runtime_error with the reason when it cannot serve the communicator. Sets `name` to
  // what it connected (shm reaches the ranks of other nodes through MPI).
  std::unique_ptr<Transport> (*connect)(MPI_Comm comm, const RingOptions& ring, std::string& name);
};

std::string peers(int n) { return std::to_string(n) + (n == 1 ? " peer" : " peers"); }

const RingTransportOption kRingTransports[] = {
    {"shm",
     [](MPI_Comm comm, const RingOptions& ring, std::string& name) -> std::unique_ptr<Transport> {
       // Room for a step's K slices plus one, so a step's sends go out at once (eagerly).
       const size_t fifo = std::max(ShmTransport::kDefaultFifoBytes,
                                    (ring.slices_per_chunk + 1) * ring.slice_elems * sizeof(float));
       auto shm = std::make_unique<ShmTransport>(comm, fifo);
       const int remote = shm->size() - 1 - shm->local_peers();
       name = remote == 0 ? "shm" : "shm (" + peers(shm->local_peers()) + ") + mpi (" + peers(remote) + ")";
       return shm;
     }},
    {"mpi",
     [](MPI_Comm comm, const RingOptions&, std::string& name) -> std::unique_ptr<Transport> {
       name = "mpi";
       return std::make_unique<MpiTransport>(comm);
     }},
};

std::unique_ptr<Transport> connect_ring_transport(MPI_Comm comm, const RingOptions& ring, std::string& name) {
  const std::string first = comm_transport();
  bool tried = false;
  for (const RingTransportOption& option : kRingTransports) {
    if (!tried && first != option.name) continue;
    tried = true;
    try {
      return option.connect(comm, ring, name);
    } catch (const std::runtime_error& e) {
      int rank = 0;
      MPI_Comm_rank(comm, &rank);
      if (rank == 0) std::fprintf(stderr, "ddplab: the %s transport did not connect (%s); trying the next\n",
                                  option.name, e.what());
    }
  }
  throw std::runtime_error("no transport for the ring connected");
}

}  // namespace

RingOptions ring_options(WireDtype wire) {
  RingOptions ring;
  ring.slice_elems = ring_slice_bytes() / sizeof(float);
  ring.slices_per_chunk = ring_slices_per_chunk();
  ring.wire16 = wire != WireDtype::kFp32;
  ring.format = wire == WireDtype::kFp16 ? wire::Format::kFp16 : wire::Format::kBf16;
  return ring;
}

Communicator::Communicator(MPI_Comm comm, const CommOptions& options) : comm_(comm), options_(options) {
  mpiCheck(MPI_Comm_rank(comm_, &rank_));
  mpiCheck(MPI_Comm_size(comm_, &size_));
  if (options_.impl == AllreduceImpl::kMpi && options_.wire != WireDtype::kFp32)
    throw std::invalid_argument(std::string("--comm mpi has no ") + to_string(options_.wire) +
                                " wire (MPI_Allreduce sums fp32 buffers as fp32); use --comm ring for a 16-bit wire");
  ring_ = ring_options(options_.wire);
  small_max_bytes_ = small_allreduce_bytes(size_);
  // Collective (MPI_Comm_dup): every rank must construct its Communicator with the same options.
  if (options_.impl == AllreduceImpl::kRing) {
    transport_ = connect_ring_transport(comm_, ring_, transport_name_);
    if (link_emulated(options_.link)) {
      transport_ =
          std::make_unique<LinkEmulatedTransport>(std::move(transport_), options_.link.latency_us, options_.link.gbps);
      transport_name_ += " + link emulation";
    }
  } else {
    mpiCheck(MPI_Comm_dup(comm_, &mpi_comm_));
    mpiCheck(MPI_Comm_set_errhandler(mpi_comm_, MPI_ERRORS_RETURN));
    transport_name_ = "MPI_Allreduce";
  }
}

Communicator::~Communicator() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && mpi_comm_ != MPI_COMM_NULL) MPI_Comm_free(&mpi_comm_);
}

void Communicator::allreduce_sum(float* data, size_t count, int tag) { allreduce_sum_into(data, data, count, tag); }

void Communicator::allreduce_sum_into(const float* in, float* out, size_t count, int tag) {
  if (!failed_.empty())
    throw std::runtime_error("rank " + str(rank_) + ": Communicator unusable after an earlier failure (" + failed_ +
                             ")");
  if (tag < 0 || tag > kMaxTag)
    throw std::invalid_argument("rank " + str(rank_) + ": all-reduce tag " + str(tag) + " outside [0, " + str(kMaxTag) +
                                "]");
  const watchdog::Wait wait(options_.impl == AllreduceImpl::kMpi ? "MPI_Allreduce" : "all-reduce", -1, tag);
  try {
    if (options_.impl == AllreduceImpl::kMpi) return mpi_allreduce_sum(in, out, count, tag);
    RingOptions o = ring_;
    o.tag = tag;
    if (count * sizeof(float) <= small_max_bytes_) {
      if (in != out) std::memcpy(out, in, count * sizeof(float));  // small: the copy costs next to nothing
      recursive_doubling_allreduce_sum(out, count, *transport_, scratch_, o);
    } else {
      ring_allreduce_sum(in, out, count, *transport_, scratch_, o);
    }
  } catch (const TagMismatch& e) {
    failed_ = "all-reduce order mismatch";
    throw std::runtime_error("rank " + str(rank_) + ": all-reduce order mismatch: this rank runs tag " + str(tag) +
                             ", rank " + str(e.peer) + " sent tag " + str(e.received_tag) +
                             " (ranks started their all-reduces in different orders)");
  } catch (const std::exception& e) {
    failed_ = e.what();
    throw;
  }
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
  // least as long as a bandwidth-optimal ring would on the link, 2(n-1) steps of latency + (bytes/n)/bandwidth.
  if (link_emulated(options_.link) && size_ > 1) {
    const double step_ns =
        options_.link.latency_us * 1e3 +
        (options_.link.gbps > 0 ? count * sizeof(float) / double(size_) * 8.0 / options_.link.gbps : 0.0);
    sleep_until_ns(start + static_cast<int64_t>(2.0 * (size_ - 1) * step_ns));
  }
}

void Communicator::allreduce_mean(float* data, size_t count, int tag) {
  allreduce_sum(data, count, tag);
  cpu::scale(data, 1.0f / static_cast<float>(size_), static_cast<int64_t>(count));
}

}  // namespace ddplab
