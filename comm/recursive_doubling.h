// Recursive-doubling all-reduce for small buffers, where the ring's 2(n-1) message latencies dominate: log2(p)
// exchanges of the whole buffer with partner rank ^ 2^k (p = the largest power of two <= n). The n - p extra
// ranks fold in first (rank 2i sends its buffer to 2i+1 for i < n - p, which adds it and takes part) and get the
// result back at the end (MPICH's scheme).
//
// Bitwise identical on every rank: the two partners of an exchange hold the same two operands and IEEE addition
// is commutative, so both compute the same sum; folded-out ranks receive a copy. With a 16-bit wire every
// operand is rounded to the wire format before it is exchanged and every sum is rounded after it, so the values
// both partners add are the same words (at most log2(p) + 2 roundings with the fold, the ring's n: docs/COMM.md).
#pragma once
#include <cstddef>

#include "comm/ring_allreduce.h"
#include "comm/transport.h"

namespace ddplab {

// The ranks of a recursive doubling over n: p, the largest power of two <= n, exchange; of each pair (2i, 2i+1),
// i < extra = n - p, the even rank folds its operand into the odd one and sits out.
struct DoublingGroup {
  int p = 1, extra = 0;
  explicit DoublingGroup(int n) {
    while (2 * p <= n) p *= 2;
    extra = n - p;
  }
  bool folds(int r) const { return r < 2 * extra; }  // one of a pair
  int exchanges() const {                            // a round's, end to end: log2 p, +2 where ranks fold in and out
    int log2p = 0;
    while ((1 << log2p) < p) ++log2p;
    return log2p + (extra > 0 ? 2 : 0);
  }
};

// The schedule, written once for the host's exchanges (below) and the device ring's (comm/ring_device.h), against
// four steps on this rank's operand: send(peer) (non-blocking), recv_copy(peer) (operand = peer's), recv_add(peer)
// (operand += peer's) and exchange_add(peer) (both partners add the other's).
template <typename Ops>
void run_doubling_schedule(Ops& ops, int n, int r) {
  const DoublingGroup g(n);
  if (g.folds(r) && r % 2 == 0) {  // hands its operand over, and gets the sum back at the end
    ops.send(r + 1);
    ops.recv_copy(r + 1);
    return;
  }
  if (g.folds(r)) ops.recv_add(r - 1);
  const int v = g.folds(r) ? r / 2 : r - g.extra;  // rank among the p that exchange
  for (int mask = 1; mask < g.p; mask <<= 1) {
    const int w = v ^ mask;
    ops.exchange_add(w < g.extra ? 2 * w + 1 : w + g.extra);
  }
  if (g.folds(r)) ops.send(r - 1);  // the sum back to the partner that sat out
}

// Same contract as ring_allreduce_sum (same scratch; options.slice_elems is not used).
void recursive_doubling_allreduce_sum(float* data, size_t count, Transport& t, RingScratch& scratch,
                                      const RingOptions& options);

}  // namespace ddplab
