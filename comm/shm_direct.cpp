#include "comm/shm_direct.h"

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <fstream>
#include <stdexcept>
#include <string>

#include "kernels/cpu/ops.h"
#include "runtime/watchdog.h"

namespace ddplab {

// A rank's notices to its host peers, each on its own cache line, written by the rank only: its arrival at a call
// (what it runs and where its buffers lie), then its departure (done with every rank's buffers). `call` is written
// last, with release semantics; calls are numbered from 1.
struct DirectCollectives::Board {
  struct alignas(64) Arrival {
    uint64_t call;
    uint64_t count;
    int32_t tag;
    int32_t kind;                // Kind
    int32_t registered;          // in and out lie in segments every host peer maps (then the fields below apply)
    uint64_t in_segment, in_at;  // where `in` lies in this rank's process: segment id and offset
    uint64_t out_segment, out_at;
  } arrival;
  struct alignas(64) Departure {
    uint64_t call;
    uint64_t nonfinite;  // blocks of this rank's chunks whose sums were not all finite (when checked)
    uint64_t unmapped;   // 1 + a peer whose buffers this rank could not find in its mappings; 0: none
  } departure;
};

// What the arrivals said: whether every rank's buffers are registered, and where they lie here (per rank).
struct DirectCollectives::Arrivals {
  bool everyone_registered;
  int unmapped;  // a peer whose buffers this rank cannot find in its mappings; -1: none
};

namespace {

std::atomic<uint64_t> direct_collectives{0}, streamed_collectives{0};

// dst[0, m) = src[0, m) with non-temporal stores (SSE's, on any x86-64: memory bounds them, not the width) where dst
// is 16-byte aligned, the ends ordinarily. The caller fences (_mm_sfence) before anyone may read dst.
void stream_copy(float* dst, const float* src, size_t m) {
  size_t i = 0;
  for (; i < m && reinterpret_cast<uintptr_t>(dst + i) % 16 != 0; ++i) dst[i] = src[i];
  for (; i + 4 <= m; i += 4) _mm_stream_ps(dst + i, _mm_loadu_ps(src + i));
  for (; i < m; ++i) dst[i] = src[i];
}

// outs[k][i] = scale x (((ins[0][i] + ins[1][i]) + ins[2][i]) + ...) for every output k and i in [begin, end): one
// rank's sum, in the order given, goes to every output. One input (the all-gather) is copied as it is: scale and
// check apply to sums only. Block by block: the block's sum is formed once, in L1, then copied into each output, with
// non-temporal stores when `stream` (fenced before it returns). Returns how many blocks had a non-finite sum (counted
// only when `check`).
uint64_t sum_into_all(const std::vector<const float*>& ins, const std::vector<float*>& outs, size_t begin, size_t end,
                      float scale, bool check, bool stream) {
  constexpr size_t kBlock = 1024;  // 4 KiB
  alignas(64) float sum[kBlock];
  uint64_t nonfinite = 0;
  for (size_t at = begin; at < end; at += kBlock) {
    const size_t m = std::min(kBlock, end - at);
    const float* block = ins[0] + at;
    if (ins.size() > 1) {
      const float* b = ins[1] + at;
      for (size_t i = 0; i < m; ++i) sum[i] = block[i] + b[i];
      for (size_t k = 2; k < ins.size(); ++k) {
        const float* c = ins[k] + at;
        for (size_t i = 0; i < m; ++i) sum[i] += c[i];
      }
      if (scale != 1.0f)
        for (size_t i = 0; i < m; ++i) sum[i] *= scale;
      if (check && !cpu::all_finite(sum, static_cast<int64_t>(m))) ++nonfinite;
      block = sum;
    }
    for (float* out : outs)
      if (stream)
        stream_copy(out + at, block, m);
      else
        std::memcpy(out + at, block, m * sizeof(float));
  }
  if (stream) _mm_sfence();
  return nonfinite;
}

const char* name_of(DirectCollectives::Kind kind) {
  switch (kind) {
    case DirectCollectives::Kind::kAllreduce:
      return "all-reduce";
    case DirectCollectives::Kind::kReduceScatter:
      return "reduce-scatter";
    case DirectCollectives::Kind::kAllGather:
      return "all-gather";
  }
  return "?";
}

}  // namespace

// sysfs, not glibc: sysconf(_SC_LEVEL3_CACHE_SIZE) said 320 MiB on a 32 MiB Zen 4 guest.
size_t last_level_cache_bytes() {
  static const size_t bytes = [] {
    size_t largest = 0;
    for (int index = 0; index < 8; ++index) {
      std::ifstream f("/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(index) + "/size");
      size_t kib = 0;
      char unit = 0;
      if (f >> kib >> unit && unit == 'K') largest = std::max(largest, kib << 10);
    }
    return largest ? largest : size_t{32} << 20;
  }();
  return bytes;
}

uint64_t shm_direct_collectives() { return direct_collectives.load(std::memory_order_relaxed); }
uint64_t shm_streamed_collectives() { return streamed_collectives.load(std::memory_order_relaxed); }

DirectCollectives::DirectCollectives(ShmTransport& shm) : shm_(shm), rank_(shm.rank()), size_(shm.size()) {
  static_assert(sizeof(Board) <= ShmTransport::kBoardBytes, "the board fits the room the transport leaves for it");
  if (size_ < 2 || shm.local_peers() != size_ - 1)
    throw std::logic_error("DirectCollectives: needs 2+ ranks, all reached through shared memory");
}

DirectCollectives::Board& DirectCollectives::board(int rank) const { return *static_cast<Board*>(shm_.board(rank)); }

std::optional<bool> DirectCollectives::run(Kind kind, const float* in, float* out, size_t count,
                                           const RingOptions& options) {
  if (options.wire16) throw std::logic_error("DirectCollectives: the fp32 wire only");
  arrive(kind, in, out, count, options.tag);
  const Arrivals seen = gather_arrivals(kind, in, out, count, options.tag);
  // Every rank saw the same arrivals, so all agree whether to go on (else all run the ring instead).
  const bool go = seen.everyone_registered && seen.unmapped < 0;
  const uint64_t nonfinite = go ? reduce_owned_chunks(kind, in, out, count, options) : 0;
  const bool finite = depart(kind, nonfinite, seen.unmapped, options.tag);
  if (!seen.everyone_registered) return std::nullopt;
  return finite;
}

// Says what this rank runs, and where its buffers lie if every host peer maps them. (The ring's cut, which decides
// the chunks each rank owns, comes from settings that every rank shares: check_same_on_every_rank.)
void DirectCollectives::arrive(Kind kind, const float* in, float* out, size_t count, int tag) {
  const size_t bytes = count * sizeof(float);
  shm_detail::Reference in_ref{}, out_ref{};
  bool registered = bytes > 0;
  for (int p = 0; p < size_ && registered; ++p)
    registered = p == rank_ || (shm_detail::find_reference(in, bytes, shm_.process_of(p), in_ref) &&
                                shm_detail::find_reference(out, bytes, shm_.process_of(p), out_ref));
  Board::Arrival& mine = board(rank_).arrival;
  mine.count = count;
  mine.tag = tag;
  mine.kind = static_cast<int32_t>(kind);
  mine.registered = registered;
  mine.in_segment = in_ref.segment, mine.in_at = in_ref.at;
  mine.out_segment = out_ref.segment, mine.out_at = out_ref.at;
  __atomic_store_n(&mine.call, ++calls_, __ATOMIC_RELEASE);
}

// Waits for every peer's arrival, from the predecessor on, so that a mismatch is named as the ring names it. A peer
// is at most one call behind: it posts call k + 1 only after every rank departed from call k, this one included. A
// message from a peer means that it runs another collective (the orders differ): named at once too.
DirectCollectives::Arrivals DirectCollectives::gather_arrivals(Kind kind, const float* in, float* out, size_t count,
                                                               int tag) {
  const size_t bytes = count * sizeof(float);
  ins_.assign(size_, nullptr), outs_.assign(size_, nullptr);
  Arrivals seen{board(rank_).arrival.registered != 0, -1};
  for (int back = 1; back <= size_; ++back) {
    const int p = (rank_ - back + size_) % size_;
    const Board::Arrival& theirs = board(p).arrival;
    std::optional<std::pair<int, int>> message;  // from a peer already in another operation: its sender and tag
    {
      const watchdog::Wait wait("direct collective: the arrival of", shm_.named(p), tag);
      shm_.wait_for([&] {
        if (__atomic_load_n(&theirs.call, __ATOMIC_ACQUIRE) == calls_) return true;
        message = shm_.message_waiting();
        return message.has_value();
      });
    }
    if (message) {
      shm_.abandon();  // as on any mismatch: the transport is done for
      throw TagMismatch(shm_.named(rank_), shm_.named(message->first), tag, message->second);
    }
    if (theirs.tag != tag) throw TagMismatch(shm_.named(rank_), shm_.named(p), tag, theirs.tag);
    if (theirs.kind != static_cast<int32_t>(kind))
      throw std::runtime_error("rank " + std::to_string(shm_.named(rank_)) + ": collective mismatch on tag " +
                               std::to_string(tag) + ": this rank runs " + name_of(kind) + ", rank " +
                               std::to_string(shm_.named(p)) + " runs " + name_of(static_cast<Kind>(theirs.kind)));
    if (theirs.count != count)
      throw std::runtime_error("rank " + std::to_string(shm_.named(rank_)) + ": " + name_of(kind) +
                               " size mismatch on tag " + std::to_string(tag) + ": this rank has " +
                               std::to_string(count) + " elements, rank " + std::to_string(shm_.named(p)) + " has " +
                               std::to_string(theirs.count));
    seen.everyone_registered = seen.everyone_registered && theirs.registered;
    if (!seen.everyone_registered) continue;
    if (p == rank_) {
      ins_[p] = in, outs_[p] = out;
      continue;
    }
    const uint64_t owner = shm_.process_of(p);
    ins_[p] = reinterpret_cast<const float*>(shm_detail::resolve({owner, theirs.in_segment, theirs.in_at}, bytes));
    outs_[p] = reinterpret_cast<float*>(shm_detail::resolve({owner, theirs.out_segment, theirs.out_at}, bytes));
    if ((!ins_[p] || !outs_[p]) && seen.unmapped < 0) seen.unmapped = p;
  }
  return seen;
}

// This rank's chunks, as the ring would have it own them. Sums go in the ring's order: chunk r+1 of each round
// starts at rank r+1 and ends with this rank's addend (RingRound). So the result is the ring's, bit for bit.
uint64_t DirectCollectives::reduce_owned_chunks(Kind kind, const float* in, float* out, size_t count,
                                                const RingOptions& options) {
  sources_.clear(), targets_.clear();
  if (kind == Kind::kAllGather) {
    sources_.push_back(in);
    for (int p = 0; p < size_; ++p)
      if (p != rank_) targets_.push_back(outs_[p]);
  } else {
    for (int j = 1; j <= size_; ++j) sources_.push_back(ins_[(rank_ + j) % size_]);
    if (kind == Kind::kAllreduce)
      targets_ = outs_;
    else
      targets_.push_back(out);
  }
  // Out of place, once every rank's output together outgrows the last-level cache, the sums go to memory with
  // non-temporal stores: no line of an output is read before it is overwritten (on Zen 4 out of place at 16-256
  // MiB: +48% to +106%; at 4 MiB, where the outputs stay in the cache, they lose: docs/COMM.md, "The direct
  // all-reduce"). In place the lines were just read, and an ordinary store hits them in the cache.
  const bool stream = in != out && count * sizeof(float) * static_cast<size_t>(size_) >= last_level_cache_bytes();
  uint64_t nonfinite = 0;
  for (const RingChunk& c : ring_owned_chunks(count, size_, rank_, options))
    nonfinite += sum_into_all(sources_, targets_, c.offset, c.offset + c.count, options.final_scale,
                              options.check_finite, stream);
  direct_collectives.fetch_add(1, std::memory_order_relaxed);
  if (stream) streamed_collectives.fetch_add(1, std::memory_order_relaxed);
  return nonfinite;
}

// Departs, and waits until every rank has: then no one reads or writes this rank's buffers any more, and its output
// holds every chunk it is to receive. A rank that could not map a peer's buffers departs too, so that every rank
// throws. Returns whether every sum this rank's output holds is finite.
bool DirectCollectives::depart(Kind kind, uint64_t nonfinite, int unmapped, int tag) {
  Board::Departure& gone = board(rank_).departure;
  gone.nonfinite = nonfinite;
  gone.unmapped = static_cast<uint64_t>(unmapped + 1);
  __atomic_store_n(&gone.call, calls_, __ATOMIC_RELEASE);
  std::string failure;
  for (int p = 0; p < size_; ++p) {
    const Board::Departure& theirs = board(p).departure;
    {
      const watchdog::Wait wait("direct collective: the departure of", shm_.named(p), tag);
      shm_.wait_for([&] { return __atomic_load_n(&theirs.call, __ATOMIC_ACQUIRE) >= calls_; });
    }
    if (kind == Kind::kAllreduce && p != rank_) nonfinite += theirs.nonfinite;  // their sums are in our output too
    if (theirs.unmapped && failure.empty())
      failure = "rank " + std::to_string(shm_.named(rank_)) + ": direct " + name_of(kind) + ": rank " +
                std::to_string(shm_.named(p)) + " does not map the registered segment of rank " +
                std::to_string(shm_.named(theirs.unmapped - 1)) + "'s buffers (freed there?)";
  }
  if (!failure.empty()) throw std::runtime_error(failure);
  return nonfinite == 0;
}

}  // namespace ddplab
