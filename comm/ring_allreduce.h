// Ring all-reduce on host fp32 buffers, written once against Transport primitives so that it reads like the
// textbook (and NCCL's ring): reduce-scatter, then all-gather, each n-1 steps around the ring.
#pragma once
#include <cstddef>
#include <vector>

#include "comm/transport.h"

namespace ddplab {

// A contiguous run of elements that travels the ring as one message.
struct RingChunk {
  size_t offset = 0;
  size_t count = 0;
};

// Chunk k of n: count/n elements each, the first count%n chunks one longer, so any count works (0, < n, ...).
RingChunk ring_chunk(size_t count, int n, int k);

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
class RingPrimitives {
 public:
  // `scratch` is grown to max_chunk elements; it only ever receives, it is never sent.
  RingPrimitives(Transport& t, float* data, std::vector<float>& scratch, size_t max_chunk);

  void send(RingChunk c);                   // data[c] -> next
  void recv_reduce_send(RingChunk c);       // data[c] += prev's; data[c] -> next
  void recv_reduce_copy_send(RingChunk c);  // the last reduction: data[c] is now final; data[c] -> next
  void recv_copy_send(RingChunk c);         // data[c] = prev's; data[c] -> next
  void recv(RingChunk c);                   // data[c] = prev's

 private:
  void recv_then_retire_sends(float* dst, size_t count);

  Transport& t_;
  float* data_;
  std::vector<float>& scratch_;
  int next_, prev_;
};

// data[i] = sum over the ranks of t of data[i], in place. Every rank calls it with the same count and ends with
// bitwise-identical results: each element is summed in an order fixed by the ring, then only copied.
// `scratch` is kept by the caller so repeated calls do not reallocate. n == 1 is a no-op.
void ring_allreduce_sum(float* data, size_t count, Transport& t, std::vector<float>& scratch);

}  // namespace ddplab
