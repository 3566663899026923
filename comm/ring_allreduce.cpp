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

RingMessages::RingMessages(Transport& t, size_t max_chunk, size_t slices, int tag)
    : t_(t),
      slices_(std::max<size_t>(slices, 1)),
      stride_((max_chunk + slices_ - 1) / slices_),
      tag_(tag),
      next_((t.rank() + 1) % t.size()),
      prev_((t.rank() - 1 + t.size()) % t.size()) {}

void RingMessages::send_to_next(const void* buf, size_t bytes) {
  t_.send(next_, buf, bytes, tag_);
  ++sends_;
}

void RingMessages::recv_from_prev(void* dst, size_t bytes) {
  t_.recv(prev_, dst, bytes, tag_);
  retire();
}

void RingMessages::retire() {
  ++recvs_;
  t_.wait_sends(sends_ - recvs_);  // see the contract: sends up to the one this receive matched
}

// ---- the fp32 wire ------------------------------------------------------------------------------------------------

RingPrimitives::RingPrimitives(Transport& t, const float* in, float* out, RingScratch& scratch, size_t max_chunk,
                               size_t slices, const RingOptions& options)
    : RingMessages(t, max_chunk, slices, options.tag),
      in_(in),
      out_(out),
      final_scale_(options.final_scale),
      check_finite_(options.check_finite) {
  if (options.wire16) throw std::logic_error("RingPrimitives: the fp32 wire (Wire16RingPrimitives carries 16 bits)");
  if (scratch.recv.size() < stride_) scratch.recv.resize(stride_);
  recv_scratch_ = scratch.recv.data();
}

void RingPrimitives::check_finished(RingChunk s) {
  if (check_finite_ && !cpu::all_finite(out_ + s.offset, static_cast<int64_t>(s.count))) ++nonfinite_slices_;
}

// The transport lends its buffer and the sum is formed from it directly; the chunk's last sum takes the epilogue:
// (in + prev's) x final_scale, rounded as a separate pass would round it.
void RingPrimitives::reduce_from_prev(RingChunk s, bool last) {
  float* dst = out_ + s.offset;
  const float* own = in_ + s.offset;
  const float scale = last ? final_scale_ : 1.0f;
  t_.recv_consume(prev_, s.count * sizeof(float), tag_, recv_scratch_,
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

void RingPrimitives::send(RingChunk c) {
  for_each_slice(c, [&](RingChunk s, size_t) { send_to_next(in_ + s.offset, s.count * sizeof(float)); });
}

void RingPrimitives::recv_reduce_send(RingChunk c) {
  for_each_slice(c, [&](RingChunk s, size_t) {
    reduce_from_prev(s, /*last=*/false);
    send_to_next(out_ + s.offset, s.count * sizeof(float));
  });
}

// The chunk's last addend (NCCL's recvReduceCopySend): the reduction writes the finished sum into out, in place or not,
// with the epilogue, and that write is the "copy"; the sum goes on as the all-gather's first message.
void RingPrimitives::recv_reduce_copy_send(RingChunk c) {
  for_each_slice(c, [&](RingChunk s, size_t) {
    reduce_from_prev(s, /*last=*/true);
    send_to_next(out_ + s.offset, s.count * sizeof(float));
  });
}

// The epilogue applies here for the sharded update's reduce-scatter; the hierarchical all-reduce, which adds more
// to the sum, sets none.
void RingPrimitives::recv_reduce_copy(RingChunk c) {
  for_each_slice(c, [&](RingChunk s, size_t) { reduce_from_prev(s, /*last=*/true); });
}

void RingPrimitives::send_out(RingChunk c) {
  for_each_slice(c, [&](RingChunk s, size_t) { send_to_next(out_ + s.offset, s.count * sizeof(float)); });
}

void RingPrimitives::recv_copy_send(RingChunk c) {
  for_each_slice(c, [&](RingChunk s, size_t) {
    recv_from_prev(out_ + s.offset, s.count * sizeof(float));  // straight into out: no scratch copy
    check_finished(s);
    send_to_next(out_ + s.offset, s.count * sizeof(float));
  });
}

void RingPrimitives::recv(RingChunk c) {
  for_each_slice(c, [&](RingChunk s, size_t) {
    recv_from_prev(out_ + s.offset, s.count * sizeof(float));
    check_finished(s);
  });
}

// ---- the 16-bit wire ----------------------------------------------------------------------------------------------

Wire16RingPrimitives::Wire16RingPrimitives(Transport& t, const float* in, float* out, RingScratch& scratch,
                                           size_t max_chunk, size_t slices, const RingOptions& options)
    : RingMessages(t, max_chunk, slices, options.tag), in_(in), out_(out), format_(options.format) {
  if (!options.wire16) throw std::logic_error("Wire16RingPrimitives: the 16-bit wire (RingPrimitives carries fp32)");
  if (options.final_scale != 1.0f || options.check_finite)
    throw std::logic_error("the ring's epilogue (final_scale, check_finite) needs the fp32 wire");
  if (scratch.wire[0].size() < stride_) scratch.wire[0].resize(stride_);
  if (scratch.wire[1].size() < stride_ * slices_) scratch.wire[1].resize(stride_ * slices_);
  incoming_ = scratch.wire[0].data();
  outgoing_ = scratch.wire[1].data();
}

void Wire16RingPrimitives::reduce_into_out(RingChunk s, uint16_t* words) {
  recv_words(s);
  if (in_ != out_) std::memcpy(out_ + s.offset, in_ + s.offset, s.count * sizeof(float));
  wire::reduce_encode(format_, out_ + s.offset, words, incoming_, s.count);
}

void Wire16RingPrimitives::send(RingChunk c) {
  for_each_slice(c, [&](RingChunk s, size_t k) {
    wire::encode(format_, staged(k), in_ + s.offset, s.count);
    send_words(staged(k), s);
  });
}

void Wire16RingPrimitives::recv_reduce_send(RingChunk c) {
  for_each_slice(c, [&](RingChunk s, size_t k) {
    reduce_into_out(s, staged(k));
    send_words(staged(k), s);
  });
}

void Wire16RingPrimitives::recv_reduce_copy_send(RingChunk c) {
  for_each_slice(c, [&](RingChunk s, size_t k) {
    recv_words(s);
    if (in_ != out_) std::memcpy(out_ + s.offset, in_ + s.offset, s.count * sizeof(float));
    wire::reduce_round(format_, out_ + s.offset, staged(k), incoming_, s.count);
    send_words(staged(k), s);
  });
}

// The sum stays fp32 for the caller (hier's cross-node step adds more to it); the encoded words go unused.
void Wire16RingPrimitives::recv_reduce_copy(RingChunk c) {
  for_each_slice(c, [&](RingChunk s, size_t k) { reduce_into_out(s, staged(k)); });
}

// The owner rounds its finished chunk to the wire and keeps the rounded value, as recv_reduce_copy_send does, so
// every rank ends with the same bits.
void Wire16RingPrimitives::send_out(RingChunk c) {
  for_each_slice(c, [&](RingChunk s, size_t k) {
    wire::encode(format_, staged(k), out_ + s.offset, s.count);
    wire::decode(format_, out_ + s.offset, staged(k), s.count);
    send_words(staged(k), s);
  });
}

void Wire16RingPrimitives::recv_copy_send(RingChunk c) {
  for_each_slice(c, [&](RingChunk s, size_t k) {
    recv_words(s);
    wire::decode(format_, out_ + s.offset, incoming_, s.count);
    // Forward the received words as they are, from place k: the incoming words are the next receive's landing place
    // while this send may still be in flight, and place k's previous send is retired (the contract).
    std::memcpy(staged(k), incoming_, s.count * sizeof(uint16_t));
    send_words(staged(k), s);
  });
}

void Wire16RingPrimitives::recv(RingChunk c) {
  for_each_slice(c, [&](RingChunk s, size_t) {
    recv_words(s);
    wire::decode(format_, out_ + s.offset, incoming_, s.count);
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
  return with_ring_primitives(t, in, out, scratch, plan, options, [&](auto& prims) {
    run_ring_schedule(prims, count, plan.round, n, r);
    return prims.all_finite();
  });
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
