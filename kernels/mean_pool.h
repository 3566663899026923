// The order in which the classify head's mean pool adds a sequence's rows, one for the CPU and the GPU so that their
// fp32 pools are the same bits: the valid rows are cut into kParts consecutive parts of near-equal length, each part
// is summed from zero down its rows, and the parts' sums are added in part order. Why parts and not one walk down all
// the rows: a walk is a chain of L dependent adds per column, and B x C columns are too few to keep a GPU's memory
// busy (6144 at gpt2-small's shapes: one walk per column moved 18% of the copy bandwidth on an H200); parts give
// each column kParts independent walks.
#pragma once

#include <cstdint>

#ifdef __CUDACC__
#define DDPLAB_MEAN_POOL_HD __host__ __device__
#else
#define DDPLAB_MEAN_POOL_HD
#endif

namespace ddplab::mean_pool {

constexpr int kParts = 16;

// The first row of part p of a sequence of `length` rows (p = kParts: its end). Parts differ by at most one row; a
// sequence shorter than kParts has empty parts, whose sum is zero.
DDPLAB_MEAN_POOL_HD inline int part_begin(int length, int p) { return static_cast<int>(int64_t{length} * p / kParts); }

}  // namespace ddplab::mean_pool
