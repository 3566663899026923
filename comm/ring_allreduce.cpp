#include "comm/ring_allreduce.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>

#include "comm/wire.h"
#include "kernels/cpu/ops.h"

namespace ddplab {

RingChunk ring_chunk(size_t count, int n, int k) {
  const size_t base = count / n, extra = count % n, kk = static_cast<size_t>(k);
  return {kk * base + std::min(kk, extra), base + (kk < extra ? 1 : 0)};
}

RingPrimitives::RingPrimitives(Transport& t, const float* in, float* out, RingScratch& scratch, size_t max_chunk,
                               size_t slices, const RingOptions& options)
    : t_(t),
      in_(in),
      out_(out),
      scratch_(scratch),
      options_(options),
      slices_(std::max<size_t>(slices, 1)),
      stride_((max_chunk + slices_ - 1) / slices_),
      next_((t.rank() + 1) % t.size()),
      prev_((t.rank() - 1 + t.size()) % t.size()) {
  if (options_.wire16 && (options_.final_scale != 1.0f || options_.check_finite))
    throw std::logic_error("the ring's epilogue (final_scale, check_finite) needs the fp32 wire");
  if (options_.wire16) {
    if (scratch_.wire[0].size() < stride_) scratch_.wire[0].resize(stride_);
    if (scratch_.wire[1].size() < stride_ * slices_) scratch_.wire[1].resize(stride_ * slices_);
  } else if (scratch_.recv.size() < stride_) {
    scratch_.recv.resize(stride_);
  }
}

// K slices of near-equal size (ring_chunk again), even when the chunk has fewer than K elements: every step sends
// and receives exactly K messages, which the retire rule counts on.
template <typename Fn>
void RingPrimitives::for_each_slice(RingChunk c, Fn fn) {
  for (size_t k = 0; k < slices_; ++k) {
    RingChunk s = ring_chunk(c.count, static_cast<int>(slices_), static_cast<int>(k));
    s.offset += c.offset;
    fn(s, options_.wire16 ? scratch_.wire[1].data() + k * stride_ : nullptr,
       options_.wire16 ? scratch_.wire[0].data() : nullptr);
  }
}

void RingPrimitives::retire() {
  ++recvs_;
  t_.wait_sends(sends_ - recvs_);  // see the class comment: sends up to the one this receive matched
}

void RingPrimitives::recv_wire(void* dst, size_t count) {
  t_.recv(prev_, dst, count * (options_.wire16 ? sizeof(uint16_t) : sizeof(float)), options_.tag);
  retire();
}

void RingPrimitives::send_wire(const void* buf, size_t count) {
  t_.send(next_, buf, count * (options_.wire16 ? sizeof(uint16_t) : sizeof(float)), options_.tag);
  ++sends_;
}

void RingPrimitives::send(RingChunk c) {
  for_each_slice(c, [&](RingChunk s, uint16_t* out16, uint16_t*) {
    if (!options_.wire16) return send_wire(in_ + s.offset, s.count);
    wire::encode(options_.format, out16, in_ + s.offset, s.count);
    send_wire(out16, s.count);
  });
}

void RingPrimitives::check_finished(RingChunk s) {
  if (options_.check_finite && !cpu::all_finite(out_ + s.offset, static_cast<int64_t>(s.count))) ++nonfinite_slices_;
}

// out[s] = in[s] + prev's slice. On a 16-bit wire the incoming slice is decoded and the sum re-encoded into out16
// (what goes on to next); on fp32 the transport lends its buffer and the sum is formed from it directly, and the
// chunk's last sum takes the epilogue: (in + prev's) x final_scale, rounded as a separate pass would round it.
void RingPrimitives::reduce_from_prev(RingChunk s, uint16_t* out16, uint16_t* in16, bool last) {
  float* dst = out_ + s.offset;
  const float* own = in_ + s.offset;
  if (options_.wire16) {
    recv_wire(in16, s.count);
    if (own != dst) std::memcpy(dst, own, s.count * sizeof(float));
    return wire::reduce_encode(options_.format, dst, out16, in16, s.count);
  }
  const float scale = last ? options_.final_scale : 1.0f;
  t_.recv_consume(prev_, s.count * sizeof(float), options_.tag, scratch_.recv.data(),
                  [dst, own, scale](const void* piece, size_t offset, size_t bytes) {
                    const float* x = static_cast<const float*>(piece);
                    const float* a = own + offset / sizeof(float);
                    float* y = dst + offset / sizeof(float);
                    const size_t n = bytes / sizeof(float);
                    if (scale == 1.0f) {
                      for (size_t i = 0; i < n; ++i) y[i] = a[i] + x[i];
                    } else {
                      for (size_t i = 0; i < n; ++i) y[i] = (a[i] + x[i]) * scale;
                    }
                  });
  retire();
  if (last) check_finished(s);
}

void RingPrimitives::recv_reduce_send(RingChunk c) {
  for_each_slice(c, [&](RingChunk s, uint16_t* out16, uint16_t* in16) {
    reduce_from_prev(s, out16, in16);
    if (options_.wire16) return send_wire(out16, s.count);
    send_wire(out_ + s.offset, s.count);
  });
}

// In place, the output buffer is the input buffer, so "reduce, copy to the output" is the reduction itself (with
// the epilogue, on fp32); on a 16-bit wire it also rounds the finished sum, which this rank keeps as its own result.
void RingPrimitives::recv_reduce_copy_send(RingChunk c) {
  if (!options_.wire16) {
    return for_each_slice(c, [&](RingChunk s, uint16_t* out16, uint16_t* in16) {
      reduce_from_prev(s, out16, in16, /*last=*/true);
      send_wire(out_ + s.offset, s.count);
    });
  }
  for_each_slice(c, [&](RingChunk s, uint16_t* out16, uint16_t* in16) {
    recv_wire(in16, s.count);
    if (in_ != out_) std::memcpy(out_ + s.offset, in_ + s.offset, s.count * sizeof(float));
    wire::reduce_round(options_.format, out_ + s.offset, out16, in16, s.count);
    send_wire(out16, s.count);
  });
}

// The sum stays fp32 here; on a 16-bit wire the encoded copy in out16 goes unused. The epilogue applies on the fp32
// wire (the sharded update's reduce-scatter); the hierarchical all-reduce, which adds more to the sum, sets none.
void RingPrimitives::recv_reduce_copy(RingChunk c) {
  for_each_slice(c, [&](RingChunk s, uint16_t* out16, uint16_t* in16) {
    reduce_from_prev(s, out16, in16, /*last=*/!options_.wire16);
  });
}

// On a 16-bit wire the owner rounds its finished chunk to the wire format and keeps the rounded value, as
// recv_reduce_copy_send does, so every rank ends with the same bits.
void RingPrimitives::send_out(RingChunk c) {
  for_each_slice(c, [&](RingChunk s, uint16_t* out16, uint16_t*) {
    float* data = out_ + s.offset;
    if (!options_.wire16) return send_wire(data, s.count);
    wire::encode(options_.format, out16, data, s.count);
    wire::decode(options_.format, data, out16, s.count);
    send_wire(out16, s.count);
  });
}

void RingPrimitives::recv_copy_send(RingChunk c) {
  for_each_slice(c, [&](RingChunk s, uint16_t* out16, uint16_t* in16) {
    if (!options_.wire16) {
      recv_wire(out_ + s.offset, s.count);  // straight into out: no reduction, no scratch copy
      check_finished(s);
      return send_wire(out_ + s.offset, s.count);
    }
    recv_wire(in16, s.count);
    wire::decode(options_.format, out_ + s.offset, in16, s.count);
    std::memcpy(out16, in16, s.count * sizeof(uint16_t));  // forward the received words as they are
    send_wire(out16, s.count);
  });
}

void RingPrimitives::recv(RingChunk c) {
  for_each_slice(c, [&](RingChunk s, uint16_t*, uint16_t* in16) {
    if (!options_.wire16) {
      recv_wire(out_ + s.offset, s.count);
      return check_finished(s);
    }
    recv_wire(in16, s.count);
    wire::decode(options_.format, out_ + s.offset, in16, s.count);
  });
}

bool epilogue_pass(float* data, size_t count, float scale, bool check_finite) {
  const auto n = static_cast<int64_t>(count);
  if (check_finite) return cpu::scale_and_check_finite(data, scale, n);
  if (scale != 1.0f) cpu::scale(data, scale, n);
  return true;
}

bool ring_allreduce_sum(float* data, size_t count, Transport& t, RingScratch& scratch, const RingOptions& options) {
  return ring_allreduce_sum(data, data, count, t, scratch, options);
}

bool ring_allreduce_sum(const float* in, float* out, size_t count, Transport& t, RingScratch& scratch,
                        const RingOptions& options) {
  const int n = t.size(), r = t.rank();
  if (n == 1 || count == 0) {  // every rank has the same count, so all skip together
    if (in != out && count) std::memcpy(out, in, count * sizeof(float));
    return epilogue_pass(out, count, options.final_scale, options.check_finite);
  }
  const RingPlan plan = plan_ring(count, n, options);
  RingPrimitives prims(t, in, out, scratch, plan.max_chunk, plan.slices, options);
  run_ring_schedule(prims, count, plan.round, n, r);
  return prims.all_finite();
}

std::vector<RingChunk> ring_owned_chunks(size_t count, int n, int r, const RingOptions& options) {
  if (n == 1) return {RingChunk{0, count}};
  const size_t round = plan_ring(count, n, options).round;
  std::vector<RingChunk> owned;
  for (size_t begin = 0; begin < count; begin += round) {
    const RingChunk c = RingRound{begin, std::min(round, count - begin), n, r}.owned();
    if (c.count) owned.push_back(c);
  }
  return owned;
}

bool ring_reduce_scatter_sum(float* data, size_t count, Transport& t, RingScratch& scratch,
                             const RingOptions& options) {
  if (options.wire16) throw std::logic_error("ring_reduce_scatter_sum: the sharded update needs the fp32 wire");
  const int n = t.size();
  if (n == 1 || count == 0) return epilogue_pass(data, count, options.final_scale, options.check_finite);
  const RingPlan plan = plan_ring(count, n, options);
  RingPrimitives prims(t, data, data, scratch, plan.max_chunk, plan.slices, options);
  for (size_t begin = 0; begin < count; begin += plan.round)
    ring_reduce_scatter<RingSeam::kApart>(prims, RingRound{begin, std::min(plan.round, count - begin), n, t.rank()});
  return prims.all_finite();
}

void ring_all_gather_owned(float* data, size_t count, Transport& t, RingScratch& scratch, const RingOptions& options) {
  if (options.wire16) throw std::logic_error("ring_all_gather_owned: the parameters travel in fp32");
  const int n = t.size();
  if (n == 1 || count == 0) return;
  RingOptions copy_only = options;  // nothing is summed: no epilogue
  copy_only.final_scale = 1.0f;
  copy_only.check_finite = false;
  const RingPlan plan = plan_ring(count, n, copy_only);
  RingPrimitives prims(t, data, data, scratch, plan.max_chunk, plan.slices, copy_only);
  for (size_t begin = 0; begin < count; begin += plan.round)
    ring_all_gather<RingSeam::kApart>(prims, RingRound{begin, std::min(plan.round, count - begin), n, t.rank()});
}

RingPlan plan_ring(size_t count, int n, const RingOptions& options) {
  RingPlan plan;
  const size_t per_chunk = std::max<size_t>(options.slices_per_chunk, 1);
  plan.round = options.slice_elems ? std::min(count, options.slice_elems * per_chunk * n) : count;
  plan.max_chunk = ring_chunk(plan.round, n, 0).count;
  // Every round has the same K (a shorter last round just has shorter slices).
  plan.slices = options.slice_elems
                    ? std::min(per_chunk, (plan.max_chunk + options.slice_elems - 1) / options.slice_elems)
                    : 1;
  return plan;
}

}  // namespace ddplab
