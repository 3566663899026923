#include "comm/ring_allreduce.h"

#include <algorithm>
#include <utility>

namespace ddplab {

RingChunk ring_chunk(size_t count, int n, int k) {
  const size_t base = count / n, extra = count % n, kk = static_cast<size_t>(k);
  return {kk * base + std::min(kk, extra), base + (kk < extra ? 1 : 0)};
}

RingPrimitives::RingPrimitives(Transport& t, float* data, RingScratch& scratch, size_t max_chunk,
                               const RingOptions& options)
    : t_(t),
      data_(data),
      scratch_(scratch),
      options_(options),
      next_((t.rank() + 1) % t.size()),
      prev_((t.rank() - 1 + t.size()) % t.size()) {
  if (options_.wire16) {
    for (auto& w : scratch_.wire)
      if (w.size() < max_chunk) w.resize(max_chunk);
    in16_ = scratch_.wire[0].data();
    out16_ = scratch_.wire[1].data();
  } else if (scratch_.recv.size() < max_chunk) {
    scratch_.recv.resize(max_chunk);
  }
}

void RingPrimitives::recv_then_retire_sends(void* dst, size_t count) {
  t_.recv(prev_, dst, count * (options_.wire16 ? sizeof(uint16_t) : sizeof(float)), options_.tag);
  t_.wait_sends();  // see the class comment: after, never before, the receive. Both 16-bit buffers are free now.
}

void RingPrimitives::send_wire(const void* buf, size_t count) {
  t_.send(next_, buf, count * (options_.wire16 ? sizeof(uint16_t) : sizeof(float)), options_.tag);
}

void RingPrimitives::send(RingChunk c) {
  if (!options_.wire16) return send_wire(data_ + c.offset, c.count);
  wire::encode(options_.format, out16_, data_ + c.offset, c.count);
  send_wire(out16_, c.count);
}

void RingPrimitives::recv_reduce_send(RingChunk c) {
  // data[c] has not been sent yet in this reduce-scatter, so it may be written now.
  float* dst = data_ + c.offset;
  if (options_.wire16) {
    recv_then_retire_sends(in16_, c.count);
    wire::reduce_encode(options_.format, dst, out16_, in16_, c.count);
    return send_wire(out16_, c.count);
  }
  recv_then_retire_sends(scratch_.recv.data(), c.count);
  const float* src = scratch_.recv.data();
  for (size_t i = 0; i < c.count; ++i) dst[i] += src[i];
  send_wire(dst, c.count);
}

// In place, the output buffer is the input buffer, so "reduce, copy to the output" is the reduction itself; on a
// 16-bit wire it also rounds the finished sum, which this rank keeps as its own result.
void RingPrimitives::recv_reduce_copy_send(RingChunk c) {
  if (!options_.wire16) return recv_reduce_send(c);
  recv_then_retire_sends(in16_, c.count);
  wire::reduce_round(options_.format, data_ + c.offset, out16_, in16_, c.count);
  send_wire(out16_, c.count);
}

void RingPrimitives::recv_copy_send(RingChunk c) {
  if (!options_.wire16) {
    recv_then_retire_sends(data_ + c.offset, c.count);  // straight into data: no reduction, no scratch copy
    return send_wire(data_ + c.offset, c.count);
  }
  recv_then_retire_sends(in16_, c.count);
  wire::decode(options_.format, data_ + c.offset, in16_, c.count);
  send_wire(in16_, c.count);  // forward the received words as they are; the next receive goes to the other buffer
  std::swap(in16_, out16_);
}

void RingPrimitives::recv(RingChunk c) {
  if (!options_.wire16) return recv_then_retire_sends(data_ + c.offset, c.count);
  recv_then_retire_sends(in16_, c.count);
  wire::decode(options_.format, data_ + c.offset, in16_, c.count);
}

void ring_allreduce_sum(float* data, size_t count, Transport& t, RingScratch& scratch, const RingOptions& options) {
  const int n = t.size(), r = t.rank();
  if (n == 1 || count == 0) return;  // every rank has the same count, so all skip together
  const size_t round = options.slice_elems ? std::min(count, options.slice_elems * n) : count;
  RingPrimitives prims(t, data, scratch, ring_chunk(round, n, 0).count, options);

  // Rounds of n * slice elements, each a whole ring, one after the other (NCCL's loop over chunks). Sends are
  // non-blocking, so a rank that finishes a round starts the next while its neighbours still finish this one.
  for (size_t begin = 0; begin < count; begin += round) {
    const size_t len = std::min(round, count - begin);
    // Step s moves chunk (r - s) mod n. Chunk c starts at rank c and picks up one addend per hop, so its sum is
    // always formed as ((x_c + x_c+1) + x_c+2) + ... whichever rank computes it. Rank r ends owning chunk r+1.
    auto chunk = [&](int step) {
      RingChunk c = ring_chunk(len, n, ((r - step) % n + n) % n);
      c.offset += begin;
      return c;
    };
    // Reduce-scatter.
    prims.send(chunk(0));
    for (int s = 1; s < n - 1; ++s) prims.recv_reduce_send(chunk(s));
    prims.recv_reduce_copy_send(chunk(n - 1));
    // All-gather: finished chunks travel on around the ring and are only copied, so every rank ends bitwise equal.
    for (int s = n; s < 2 * n - 2; ++s) prims.recv_copy_send(chunk(s));
    prims.recv(chunk(2 * n - 2));  // its wait also retires the last send: data may be reused on return
  }
}

}  // namespace ddplab
