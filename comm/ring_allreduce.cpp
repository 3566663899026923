#include "comm/ring_allreduce.h"

#include <algorithm>

namespace ddplab {

RingChunk ring_chunk(size_t count, int n, int k) {
  const size_t base = count / n, extra = count % n, kk = static_cast<size_t>(k);
  return {kk * base + std::min(kk, extra), base + (kk < extra ? 1 : 0)};
}

RingPrimitives::RingPrimitives(Transport& t, float* data, std::vector<float>& scratch, size_t max_chunk)
    : t_(t),
      data_(data),
      scratch_(scratch),
      next_((t.rank() + 1) % t.size()),
      prev_((t.rank() - 1 + t.size()) % t.size()) {
  if (scratch_.size() < max_chunk) scratch_.resize(max_chunk);
}

void RingPrimitives::recv_then_retire_sends(float* dst, size_t count) {
  t_.recv(prev_, dst, count * sizeof(float));
  t_.wait_sends();  // see the class comment: after, never before, the receive
}

void RingPrimitives::send(RingChunk c) { t_.send(next_, data_ + c.offset, c.count * sizeof(float)); }

void RingPrimitives::recv_reduce_send(RingChunk c) {
  recv_then_retire_sends(scratch_.data(), c.count);
  // data[c] has not been sent yet in this reduce-scatter, so it may be written now.
  float* dst = data_ + c.offset;
  const float* src = scratch_.data();
  for (size_t i = 0; i < c.count; ++i) dst[i] += src[i];
  send(c);
}

// In place, the output buffer is the input buffer, so "reduce, copy to the output" is the reduction itself.
// The separate name keeps the algorithm reading like NCCL's and gives an out-of-place variant its place.
void RingPrimitives::recv_reduce_copy_send(RingChunk c) { recv_reduce_send(c); }

void RingPrimitives::recv_copy_send(RingChunk c) {
  recv_then_retire_sends(data_ + c.offset, c.count);  // straight into data: no reduction, no scratch copy
  send(c);
}

void RingPrimitives::recv(RingChunk c) { recv_then_retire_sends(data_ + c.offset, c.count); }

void ring_allreduce_sum(float* data, size_t count, Transport& t, std::vector<float>& scratch) {
  const int n = t.size(), r = t.rank();
  if (n == 1 || count == 0) return;  // every rank has the same count, so all skip together
  RingPrimitives prims(t, data, scratch, ring_chunk(count, n, 0).count);

  // Step s moves chunk (r - s) mod n. Chunk c starts at rank c and picks up one addend per hop, so its sum is
  // always formed as ((x_c + x_c+1) + x_c+2) + ... whichever rank computes it. Rank r ends owning chunk r+1.
  // Pipelining (later issue): slice each chunk and run this same step sequence per slice, several in flight;
  // ring_chunk and the primitives stay as they are.
  auto chunk = [&](int step) { return ring_chunk(count, n, ((r - step) % n + n) % n); };

  // Reduce-scatter.
  prims.send(chunk(0));
  for (int s = 1; s < n - 1; ++s) prims.recv_reduce_send(chunk(s));
  prims.recv_reduce_copy_send(chunk(n - 1));
  // All-gather: finished chunks travel on around the ring and are only copied, so every rank ends bitwise equal.
  for (int s = n; s < 2 * n - 2; ++s) prims.recv_copy_send(chunk(s));
  prims.recv(chunk(2 * n - 2));  // its wait also retires the last send: data may be reused on return
}

}  // namespace ddplab
