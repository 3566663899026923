// Ring all-reduce on host fp32 buffers, written once against Transport primitives so that it reads like the
// textbook (and NCCL's ring): reduce-scatter, then all-gather, each n-1 receives around the ring.
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "comm/transport.h"
#include "kernels/float16.h"

namespace ddplab {

// A contiguous run of elements that travels the ring as one message.
struct RingChunk {
  size_t offset = 0;
  size_t count = 0;
};

// Chunk k of n: count/n elements each, the first count%n chunks one longer, so any count works (0, < n, ...).
RingChunk ring_chunk(size_t count, int n, int k);

// Buffers the ring reuses across calls (the caller keeps them, so repeated calls do not allocate). They only
// ever receive or stage outgoing 16-bit data; the all-reduced buffer itself is never copied.
struct RingScratch {
  std::vector<float> recv;        // fp32 wire: an incoming slice to add (when the transport cannot lend its own)
  std::vector<uint16_t> wire[2];  // 16-bit wire: one receives while the other may still be in flight
};

struct RingOptions {
  // Elements of one message (at most). Every primitive moves its chunk slice by slice, so the next rank works on
  // slice k while this one reduces slice k+1 (NCCL's slices). 0: the whole chunk in one message.
  size_t slice_elems = 0;
  // Slices per chunk. The buffer is all-reduced in rounds of n * slices_per_chunk * slice_elems elements, each a
  // complete ring (NCCL's loop over chunks), which bounds the chunk a step moves and keeps it in cache.
  size_t slices_per_chunk = 4;
  bool wire16 = false;  // bf16/fp16 on the wire (format below), fp32 otherwise
  float16::Format format = float16::Format::kBf16;
  int tag = 0;  // carried by every message (see TagMismatch)
  // The finished sums' epilogue (the gradients' mean and NaN check; NCCL's ncclAvg is done the same way), fp32 wire
  // and sums the ring finishes (the flat ring, the sharded update's reduce-scatter; never hier's partial sums). The
  // rank that adds a chunk's last addend multiplies the sum by final_scale before it travels on; with check_finite
  // every rank checks each finished slice where it lands, while it is in cache, and ring_allreduce_sum returns the
  // verdict. Neither costs a pass over the buffer of its own.
  float final_scale = 1.0f;
  bool check_finite = false;
};

// What one ring step can do to a chunk of `data` (after NCCL's Primitives), each in K slices (K is the
// same for every chunk of a round). The incoming messages always come from prev = (r-1+n)%n and the outgoing
// ones go to next = (r+1)%n.
//
// Buffer lifetimes. Sends are non-blocking, and a buffer handed to send must not change until the send completes.
// Step 0 sends K slices before the first receive, so a rank's sends lead its receives by K messages. After its
// j-th receive a rank retires its sends up to the j-th (Transport::wait_sends(keep the K-1 newest)): that cannot
// deadlock, because next has already been sent the j-th message and, to receive it, only needs its own j-1 older
// sends retired, which needs the receives we already made, and so on around the ring. (Retiring the newest send
// too does deadlock once MPI switches to rendezvous: every rank waits for a receive nobody has posted yet.)
// So at most K-1 sends are in flight when a primitive writes, all from the last K slices:
//   - reduce-scatter: data[c] is reduced into while it is received (straight from the transport's buffer where
//     it has one); it has not been sent yet in this round;
//   - all-gather: a chunk it overwrites was last sent n >= 2 steps (>= 2K messages) earlier;
//   - 16-bit wire: slice k of every step is staged at its own place k of the outgoing words (stride = the longest
//     slice); its previous use is exactly K sends old, so retired. The incoming words are read as they arrive;
//   - RingSeam::kApart: the reduce-scatter's last step only receives, so its last receive retires every send
//     before the caller works on the owned chunk, which no send has read yet.
// The last receive of a round retires everything. tests/mpi checks this contract with a wrapper.

// The bookkeeping both wires' primitives share: each chunk cut into K slices, and the messages counted so that
// every receive retires the sends the contract above allows.
class RingMessages {
 protected:
  RingMessages(Transport& t, size_t max_chunk, size_t slices, int tag);
  // fn(RingChunk slice, size_t k): K slices of near-equal size (ring_chunk again), even when the chunk has fewer
  // than K elements, so every step sends and receives exactly K messages, which the retire rule counts on.
  template <typename Fn>
  void for_each_slice(RingChunk c, Fn fn) const {
    for (size_t k = 0; k < slices_; ++k) {
      RingChunk s = ring_chunk(c.count, static_cast<int>(slices_), static_cast<int>(k));
      s.offset += c.offset;
      fn(s, k);
    }
  }
  void send_to_next(const void* buf, size_t bytes);
  void recv_from_prev(void* dst, size_t bytes);  // then retires what the contract allows
  void retire();                                 // counts a receive, then retires the sends up to the one it matched

  Transport& t_;
  const size_t slices_, stride_;  // K, and the longest slice
  const int tag_, next_, prev_;

 private:
  size_t sends_ = 0, recvs_ = 0;  // messages so far in this call
};

// The fp32 wire. The reduce-scatter adds straight from the transport's buffer where it lends one, and the chunk's
// last addition takes the epilogue (final_scale, check_finite) while the slice is in cache.
class RingPrimitives : RingMessages {
 public:
  // Reads `in`, writes `out` (the same buffer in place). max_chunk: the largest chunk of the round; slices: K.
  RingPrimitives(Transport& t, const float* in, float* out, RingScratch& scratch, size_t max_chunk, size_t slices,
                 const RingOptions& options);

  void send(RingChunk c);                   // in[c] -> next
  void recv_reduce_send(RingChunk c);       // out[c] = in[c] + prev's; out[c] -> next
  void recv_reduce_copy_send(RingChunk c);  // the last reduction: out[c] is now final; out[c] -> next
  void recv_reduce_copy(RingChunk c);       // out[c] = in[c] + prev's (+ the epilogue), kept here (RingSeam::kApart)
  void send_out(RingChunk c);               // out[c] -> next (RingSeam::kApart)
  void recv_copy_send(RingChunk c);         // out[c] = prev's; out[c] -> next
  void recv(RingChunk c);                   // out[c] = prev's
  bool all_finite() const { return nonfinite_slices_ == 0; }  // every finished slice so far (check_finite)

 private:
  // out[s] = in[s] + prev's; when `last` (the chunk's last addend), times final_scale, then checked
  void reduce_from_prev(RingChunk slice, bool last);
  void check_finished(RingChunk slice);  // check_finite: counts a slice of out holding a NaN or Inf

  const float* in_;
  float* out_;
  float* recv_scratch_;  // where an incoming slice lands when the transport cannot lend its own buffer
  float final_scale_;
  bool check_finite_;
  size_t nonfinite_slices_ = 0;
};

// The 16-bit wire (bf16 or fp16): partial sums are added in fp32 (data += decoded incoming) and rounded to 16 bits
// only to travel on; the rank that adds the last addend rounds the finished sum and keeps the rounded value itself,
// and the all-gather only copies, so every rank still ends bitwise identical. No epilogue here: it is a pass of its
// own after the sum. Slice k of every step is staged at its own place k of the outgoing words (the contract above).
class Wire16RingPrimitives : RingMessages {
 public:
  Wire16RingPrimitives(Transport& t, const float* in, float* out, RingScratch& scratch, size_t max_chunk, size_t slices,
                       const RingOptions& options);

  void send(RingChunk c);                   // in[c] -> next
  void recv_reduce_send(RingChunk c);       // out[c] = in[c] + prev's; out[c] -> next
  void recv_reduce_copy_send(RingChunk c);  // the last reduction: out[c] rounded to the wire and kept; -> next
  void recv_reduce_copy(RingChunk c);       // out[c] = in[c] + prev's, fp32, kept here (RingSeam::kApart)
  void send_out(RingChunk c);               // out[c] rounded to the wire and kept; -> next (RingSeam::kApart)
  void recv_copy_send(RingChunk c);         // out[c] = prev's; prev's words -> next as they came
  void recv(RingChunk c);                   // out[c] = prev's
  bool all_finite() const { return true; }  // nothing is checked on this wire

 private:
  uint16_t* staged(size_t k) const { return outgoing_ + k * stride_; }
  void recv_words(RingChunk s) { recv_from_prev(incoming_, s.count * sizeof(uint16_t)); }
  void send_words(const uint16_t* words, RingChunk s) { send_to_next(words, s.count * sizeof(uint16_t)); }
  void reduce_into_out(RingChunk s, uint16_t* words);  // out[s] = in[s] + prev's (received), encoded into words

  const float* in_;
  float* out_;
  float16::Format format_;
  uint16_t* incoming_;  // one slice, read at once
  uint16_t* outgoing_;  // K slices, one per place
};

// One round of the ring: elements [begin, begin + len) of the buffer, cut into n chunks. Step s of rank r moves
// chunk(s) = (r - s) mod n: step 0 only sends (its own chunk r); each step s >= 1 receives chunk(s), which prev sent
// at its step s - 1, and (but the last) sends it on. Steps 1..n-1 reduce (the reduce-scatter), steps n..2n-2 copy
// (the all-gather; chunk(s + n) == chunk(s)), so a round is 2(n-1) receives. Chunk c starts at rank c and picks up one
// addend per hop, so its sum is always formed as ((x_c + x_c+1) + x_c+2) + ... whichever rank computes it. Rank r ends
// the reduce-scatter owning chunk r+1.
struct RingRound {
  size_t begin = 0, len = 0;
  int n = 1, r = 0;
  RingChunk chunk(int step) const {
    RingChunk c = ring_chunk(len, n, ((r - step) % n + n) % n);
    c.offset += begin;
    return c;
  }
  RingChunk owned() const { return chunk(n - 1); }  // finished by the reduce-scatter on this rank
};

// How the reduce-scatter meets the all-gather. kFused (the flat ring): the last reduction sends the finished chunk
// on at once, slice by slice, as the all-gather's first step. kApart: the reduce-scatter keeps the owned chunk, the
// caller works on it (the hierarchical all-reduce reduces it across nodes; the sharded update updates the
// parameters it owns), and the all-gather starts by sending it.
enum class RingSeam { kFused, kApart };

// Reduce-scatter, n-1 steps: out[round.owned()] is the sum over the ring (kApart), or is that sum and already on
// its way to next (kFused).
template <RingSeam kSeam, typename Prims>
void ring_reduce_scatter(Prims& prims, const RingRound& round) {
  prims.send(round.chunk(0));
  for (int s = 1; s < round.n - 1; ++s) prims.recv_reduce_send(round.chunk(s));
  if constexpr (kSeam == RingSeam::kFused)
    prims.recv_reduce_copy_send(round.owned());
  else
    prims.recv_reduce_copy(round.owned());
}

// All-gather, n-1 steps: finished chunks travel on around the ring and are only copied, so every rank ends bitwise
// equal. Its receives retire every send: the buffers may be reused on return.
template <RingSeam kSeam, typename Prims>
void ring_all_gather(Prims& prims, const RingRound& round) {
  if constexpr (kSeam == RingSeam::kApart) prims.send_out(round.owned());
  for (int s = round.n; s < 2 * round.n - 2; ++s) prims.recv_copy_send(round.chunk(s));
  prims.recv(round.chunk(2 * round.n - 2));
}

// The ring schedule, written once for every set of primitives: the two wires' above on host memory, and the device
// ring's LinkRingPrimitives (comm/ring_device.h) on GPU buffers. `count` elements go round in rounds of `round`,
// each a complete ring (NCCL's loop over chunks): reduce-scatter, then all-gather, n-1 receives each.
template <typename Prims>
void run_ring_schedule(Prims& prims, size_t count, size_t round, int n, int r) {
  for (size_t begin = 0; begin < count; begin += round) {
    const RingRound rr{begin, std::min(round, count - begin), n, r};
    ring_reduce_scatter<RingSeam::kFused>(prims, rr);
    ring_all_gather<RingSeam::kFused>(prims, rr);
  }
}

// How ring_allreduce_sum cuts `count` elements over n ranks (options.slice_elems, slices_per_chunk): rounds of
// `round` elements, whose largest chunk is max_chunk, each moved in `slices` messages (the same K every round).
struct RingPlan {
  size_t round = 0, max_chunk = 0, slices = 1;
};
RingPlan plan_ring(size_t count, int n, const RingOptions& options);

// fn(prims) with the primitives of options' wire (wire16 or fp32) for one call's plan; returns what fn returns.
template <typename Fn>
auto with_ring_primitives(Transport& t, const float* in, float* out, RingScratch& scratch, const RingPlan& plan,
                          const RingOptions& options, Fn fn) {
  if (options.wire16) {
    Wire16RingPrimitives prims(t, in, out, scratch, plan.max_chunk, plan.slices, options);
    return fn(prims);
  }
  RingPrimitives prims(t, in, out, scratch, plan.max_chunk, plan.slices, options);
  return fn(prims);
}

// The reduce-scatter and the all-gather as calls of their own, for the sharded update (ZeRO stage 1, after llm.c's
// and DeepSpeed's): the gradients are reduce-scattered, each rank updates the parameters of the elements it owns,
// and the parameters are all-gathered. Both cut `count` elements into the rounds and chunks of ring_allreduce_sum
// (plan_ring), so a rank owns exactly the chunks its reduce-scatter finishes, summed in the ring's order: the two
// calls in a row give the all-reduce's bits. Every rank calls them with the same count and options.
//
// The elements rank r owns, ascending: chunk r+1 of every round (all of them at n == 1).
std::vector<RingChunk> ring_owned_chunks(size_t count, int n, int r, const RingOptions& options);
// data[owned] = sum over ranks of data[owned] (times options.final_scale, checked with options.check_finite, as the
// all-reduce does; fp32 wire only); the other elements hold partial sums. Every send is retired on return (a peer no
// longer reads data). Returns whether every owned result is finite.
bool ring_reduce_scatter_sum(float* data, size_t count, Transport& t, RingScratch& scratch, const RingOptions& options);
// data[i] = the owner's data[i], for every element: the owned chunks travel round the ring and are only copied, so
// every rank ends bitwise equal. fp32 wire only (the parameters must not be rounded).
void ring_all_gather_owned(float* data, size_t count, Transport& t, RingScratch& scratch, const RingOptions& options);

// The epilogue as a pass of its own, for the sums that could not fold it in (one rank, recursive doubling, hier,
// MPI, a 16-bit wire): data *= scale (skipped for 1) and, with check_finite, whether every result is finite, in one
// pass (cpu::scale_and_check_finite). Returns true without check_finite.
bool epilogue_pass(float* data, size_t count, float scale, bool check_finite);

// data[i] = sum over the ranks of t of data[i] (times options.final_scale), in place. Every rank calls it with the
// same count and options and ends with bitwise-identical results: each element is summed in an order fixed by the
// ring, then only copied. n == 1 is a no-op (also with a 16-bit wire: nothing travels, nothing is rounded) but for
// the epilogue. Returns whether every result is finite (always true without options.check_finite).
bool ring_allreduce_sum(float* data, size_t count, Transport& t, RingScratch& scratch, const RingOptions& options);
// Out of place: out[i] = sum over ranks of in[i]; `in` is only read (out == in is the in-place call). No extra
// pass: the first step sends from `in`, the reduce-scatter writes in[c] + incoming into out[c], the all-gather
// receives into out.
bool ring_allreduce_sum(const float* in, float* out, size_t count, Transport& t, RingScratch& scratch,
                        const RingOptions& options);

}  // namespace ddplab
