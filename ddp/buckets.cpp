#include "ddp/buckets.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "runtime/mpi_check.h"

namespace ddplab {
namespace {

// FNV-1a over the layout: equal on two ranks iff (with overwhelming probability) the layouts are equal.
uint64_t layout_hash(const std::vector<Bucket>& buckets) {
  uint64_t h = 1469598103934665603ULL;
  auto mix = [&h](int64_t v) {
    for (int i = 0; i < 8; ++i) h = (h ^ ((static_cast<uint64_t>(v) >> (8 * i)) & 0xff)) * 1099511628211ULL;
  };
  for (const Bucket& b : buckets) {
    mix(b.first_piece);
    mix(b.last_piece);
    mix(b.offset);
    mix(b.count);
  }
  return h;
}

}  // namespace

std::vector<Bucket> assign_buckets(const std::vector<int64_t>& numel, const std::vector<int64_t>& offset,
                                   const BucketCaps& caps) {
  const int n = static_cast<int>(numel.size());
  if (offset.size() != numel.size()) throw std::invalid_argument("assign_buckets: numel and offset differ in size");
  const auto end_ok = [](double cap) { return cap >= 0 || cap == BucketCaps::kAsTheOthers; };
  if (!(caps.bucket_bytes >= 0) || !end_ok(caps.first_bytes) || !end_ok(caps.last_bytes))
    throw std::invalid_argument("assign_buckets: bucket caps must not be negative");
  for (int k = 1; k < n; ++k)
    if (offset[k] < offset[k - 1] + numel[k - 1])
      throw std::invalid_argument("assign_buckets: gradient piece " + std::to_string(k) +
                                  " does not lie after the previous one in the flat buffer");
  if (n == 0) return {};
  // The fp32 bytes of the slice from piece `first` to piece `last`, the gaps between them included.
  const auto span = [&](int first, int last) {
    return static_cast<double>(offset[last] + numel[last] - offset[first]) * sizeof(float);
  };

  // Whether a bucket spanning `bytes` takes one more piece, to span `with_it`: within, if the piece keeps it within
  // the cap; reach, if it has not reached the cap yet.
  const auto takes = [&caps](double bytes, double with_it, double cap) {
    return caps.rule == BucketRule::kWithin ? with_it <= cap : bytes < cap;
  };

  // The closing bucket first where it has a cap of its own: the last pieces to become ready, backwards (at least one).
  const bool own_last = caps.last_bytes != BucketCaps::kAsTheOthers;
  int closing_first = n;
  if (own_last) {
    closing_first = n - 1;
    while (closing_first > 0 && takes(span(closing_first, n - 1), span(closing_first - 1, n - 1), caps.last_bytes))
      --closing_first;
  }

  // The rest in ready order, greedily to the cap: the first bucket's, then the others'.
  const double first_cap = caps.first_bytes == BucketCaps::kAsTheOthers ? caps.bucket_bytes : caps.first_bytes;
  std::vector<Bucket> buckets;
  for (int k = 0; k < closing_first;) {
    const double cap = buckets.empty() ? first_cap : caps.bucket_bytes;
    Bucket b;
    b.first_piece = k;
    while (k + 1 < closing_first && takes(span(b.first_piece, k), span(b.first_piece, k + 1), cap)) ++k;
    b.last_piece = k++;
    buckets.push_back(b);
  }
  if (own_last) buckets.push_back(Bucket{closing_first, n - 1, 0, 0});
  for (Bucket& b : buckets) {
    b.offset = offset[b.first_piece];
    b.count = offset[b.last_piece] + numel[b.last_piece] - b.offset;
  }
  return buckets;
}

void check_same_layout(const std::vector<Bucket>& buckets, MPI_Comm comm) {
  const uint64_t mine[2] = {layout_hash(buckets), ~layout_hash(buckets)};
  uint64_t most[2];
  mpiCheck(MPI_Allreduce(mine, most, 2, MPI_UINT64_T, MPI_MAX, comm));
  if (most[0] == mine[0] && most[1] == mine[1]) return;
  // Some rank differs: every rank sees it, every rank throws.
  int size = 1;
  MPI_Comm_size(comm, &size);
  std::vector<int> counts(size);
  const int nb = static_cast<int>(buckets.size());
  mpiCheck(MPI_Allgather(&nb, 1, MPI_INT, counts.data(), 1, MPI_INT, comm));
  std::string list;
  for (int r = 0; r < size; ++r) list += (r ? ", " : "") + std::to_string(counts[r]);
  throw std::runtime_error("gradient bucket layout differs across ranks (buckets per rank: " + list +
                           "): every rank needs the same model, bucket flags (--bucket-mb, --first-bucket-mb, "
                           "--last-bucket-mb, --bucket-rule) and --grad-slice-mb");
}

BucketCountdown::BucketCountdown(const std::vector<Bucket>& buckets, const char* who)
    : buckets_(buckets), who_(who), pending_(buckets.size()) {
  bucket_of_piece_.resize(buckets.empty() ? 0 : static_cast<size_t>(buckets.back().last_piece) + 1);
  is_ready_.resize(bucket_of_piece_.size());
  for (size_t b = 0; b < buckets.size(); ++b)
    for (int k = buckets[b].first_piece; k <= buckets[b].last_piece; ++k) bucket_of_piece_[k] = static_cast<int>(b);
  restart();
}

void BucketCountdown::restart() {
  for (size_t b = 0; b < buckets_.size(); ++b) pending_[b] = buckets_[b].num_pieces();
  std::fill(is_ready_.begin(), is_ready_.end(), 0);
  next_launch_ = 0;
}

bool BucketCountdown::mark_ready(int piece) {
  const int b = bucket_of(piece);
  // Per piece, not per bucket: a piece marked twice in a bucket of several would otherwise complete the bucket
  // while another of its pieces is still being written.
  if (is_ready_[static_cast<size_t>(piece)])
    throw std::logic_error(std::string(who_) + ": gradient piece " + std::to_string(piece) + " marked ready twice");
  is_ready_[static_cast<size_t>(piece)] = 1;
  return --pending_[b] == 0;
}

int BucketCountdown::next_to_launch() {
  if (next_launch_ == static_cast<int>(buckets_.size()) || pending_[next_launch_] != 0) return -1;
  return next_launch_++;
}

void BucketCountdown::require_all_ready() const {
  for (size_t b = 0; b < buckets_.size(); ++b) {
    if (pending_[b] != 0)
      throw std::logic_error(std::string(who_) + ": bucket " + std::to_string(b) + " (gradient pieces " +
                             std::to_string(buckets_[b].first_piece) + ".." + std::to_string(buckets_[b].last_piece) +
                             ") has gradients that were never marked ready");
  }
}

}  // namespace ddplab
