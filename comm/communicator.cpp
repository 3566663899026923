#include "comm/communicator.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <stdexcept>

#include "comm/mpi_check.h"
#include "comm/ring_allreduce.h"
#include "kernels/cpu/ops.h"

namespace ddplab {

AllreduceImpl parse_allreduce_impl(const std::string& name) {
  if (name == "ring") return AllreduceImpl::kRing;
  if (name == "mpi") return AllreduceImpl::kMpi;
  throw std::invalid_argument("unknown --comm '" + name + "' (expected ring or mpi)");
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
constexpr LinkPreset kLinkPresets[] = {
    {"none", 0, 0},          {"10gbe", 10.0, 10},  // kernel TCP over 10 GbE: ~20 us round trip
    {"25gbe", 5.0, 25},                            // 25 GbE, RoCE/tuned TCP
    {"100gbe-ib", 1.5, 100},                       // InfiniBand EDR (100 Gb/s), MPI-level one-way latency
    {"pcie4", 2.0, 252},     // PCIe 4.0 x16: 16 GT/s x 16 lanes x 128/130 = 252 Gb/s per direction
    {"nvlink4", 1.0, 3600},  // H100 NVLink 4: 18 links x 25 GB/s = 450 GB/s per direction
};

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

Communicator::Communicator(MPI_Comm comm, const CommOptions& options) : comm_(comm), options_(options) {
  mpiCheck(MPI_Comm_rank(comm_, &rank_));
  mpiCheck(MPI_Comm_size(comm_, &size_));
  // Collective (MPI_Comm_dup): every rank must construct its Communicator with the same impl.
  if (options_.impl == AllreduceImpl::kRing) transport_ = std::make_unique<MpiTransport>(comm_);
}

Communicator::~Communicator() = default;

void Communicator::allreduce_sum(float* data, size_t count, int tag) {
  (void)tag;
  switch (options_.impl) {
    case AllreduceImpl::kRing:
      ring_allreduce_sum(data, count, *transport_, scratch_);
      return;
    case AllreduceImpl::kMpi:
      // MPI counts are int: larger buffers go in INT_MAX-element pieces (elementwise, so pieces are independent).
      for (size_t offset = 0; offset < count;) {
        const int piece = static_cast<int>(std::min(count - offset, static_cast<size_t>(INT_MAX)));
        mpiCheck(MPI_Allreduce(MPI_IN_PLACE, data + offset, piece, MPI_FLOAT, MPI_SUM, comm_));
        offset += piece;
      }
      return;
  }
}

void Communicator::allreduce_mean(float* data, size_t count, int tag) {
  allreduce_sum(data, count, tag);
  cpu::scale(data, 1.0f / static_cast<float>(size_), static_cast<int64_t>(count));
}

}  // namespace ddplab
