// ring: ddplab's Communicator with --comm ring (recursive doubling for small buffers, the sliced ring above, or the
// direct all-reduce for registered buffers when every rank shares one host; docs/COMM.md), fp32 on the wire.
// ring-only: the same without the direct all-reduce (DDPLAB_DIRECT_ALLREDUCE=0). ring-bf16, ring-fp16: the same with
// a 16-bit wire (the buffers stay float).
#include "bench/allreduce_perf/impl.h"

namespace ddplab::perf {
namespace {

CommOptions ring_options(const Options& o, WireDtype wire, bool direct) {
  return {AllreduceImpl::kRing, wire, o.link, o.ranks_per_node, direct};
}

}  // namespace

std::vector<Impl> make_ring(const ImplContext& c) {
  return communicator_impl(c, ring_options(c.options, WireDtype::kFp32, /*direct=*/true));
}

std::vector<Impl> make_ring_only(const ImplContext& c) {
  return communicator_impl(c, ring_options(c.options, WireDtype::kFp32, /*direct=*/false));
}

std::vector<Impl> make_ring_bf16(const ImplContext& c) {
  return communicator_impl(c, ring_options(c.options, WireDtype::kBf16, /*direct=*/true));
}

std::vector<Impl> make_ring_fp16(const ImplContext& c) {
  return communicator_impl(c, ring_options(c.options, WireDtype::kFp16, /*direct=*/true));
}

}  // namespace ddplab::perf
