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

// Same contract as ring_allreduce_sum (same scratch; options.slice_elems is not used).
void recursive_doubling_allreduce_sum(float* data, size_t count, Transport& t, RingScratch& scratch,
                                      const RingOptions& options);

}  // namespace ddplab
