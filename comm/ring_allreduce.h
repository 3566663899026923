// Ring all-reduce on host fp32 buffers, written once against Transport primitives so that it reads like the
// textbook (and NCCL's ring): reduce-scatter, then all-gather, each n-1 steps around the ring.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "comm/transport.h"
#include "comm/wire.h"

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
  std::vector<float> recv;        // fp32 wire: an incoming slice to add
  std::vector<uint16_t> wire[2];  // 16-bit wire: one receives while the other may still be in flight
};

struct RingOptions {
  // Elements of one chunk that travel as one message. The buffer is all-reduced in rounds of n * slice elements,
  // each a complete ring (NCCL's loop over chunks): a round's data is still in cache when it is reduced and
  // sent on, and one rank's reduction overlaps its neighbours' transfers. 0: one round (no slicing).
  size_t slice_elems = 0;
  bool wire16 = false;  // bf16/fp16 on the wire (format below), fp32 otherwise
  wire::Format format = wire::Format::kBf16;
  int tag = 0;  // carried by every message (see TagMismatch)
};

// The five things one ring step can do to a chunk of `data` (after NCCL's Primitives). The incoming message
// always comes from prev = (r-1+n)%n and the outgoing one goes to next = (r+1)%n.
//
// Buffer lifetimes: sends are non-blocking, and a buffer handed to send must not change until the send completes.
// Every receive is therefore followed by Transport::wait_sends(): after the receive of step t, all sends up to
// step t-1 are done. Waiting after the receive cannot deadlock: our receive matches a send prev already started,
// and our pending send is matched by a receive next posts without waiting on us. (Waiting before it does deadlock
// once MPI switches to rendezvous: every rank waits for a receive nobody has posted yet.) It also makes the
// all-gather safe: a chunk it overwrites was last sent n >= 2 steps earlier. Cost: at most one send in flight per
// rank, which still overlaps each send with the next receive. tests/mpi checks this contract with a wrapper.
//
// 16-bit wire: partial sums are added in fp32 (data += decoded incoming) and rounded to 16 bits only to travel on;
// the rank that adds the last addend rounds the finished sum and keeps the rounded value itself, and the
// all-gather only copies, so every rank still ends bitwise identical.
class RingPrimitives {
 public:
  RingPrimitives(Transport& t, float* data, RingScratch& scratch, size_t max_chunk, const RingOptions& options);

  void send(RingChunk c);                   // data[c] -> next
  void recv_reduce_send(RingChunk c);       // data[c] += prev's; data[c] -> next
  void recv_reduce_copy_send(RingChunk c);  // the last reduction: data[c] is now final; data[c] -> next
  void recv_copy_send(RingChunk c);         // data[c] = prev's; data[c] -> next
  void recv(RingChunk c);                   // data[c] = prev's

 private:
  void recv_then_retire_sends(void* dst, size_t count);
  void send_wire(const void* buf, size_t count);

  Transport& t_;
  float* data_;
  RingScratch& scratch_;
  RingOptions options_;
  uint16_t* in16_ = nullptr;   // receives 16-bit data
  uint16_t* out16_ = nullptr;  // stages 16-bit data to send
  int next_, prev_;
};

// data[i] = sum over the ranks of t of data[i], in place. Every rank calls it with the same count and options
// and ends with bitwise-identical results: each element is summed in an order fixed by the ring, then only
// copied. n == 1 is a no-op (also with a 16-bit wire: nothing travels, nothing is rounded).
void ring_allreduce_sum(float* data, size_t count, Transport& t, RingScratch& scratch, const RingOptions& options);

}  // namespace ddplab
