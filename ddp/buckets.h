// Gradient buckets: how the gradient pieces are cut into buckets, the check that every rank cut them alike, and when
// things happened to each bucket in a step. What the reducers, the run file and the predictor share, apart from the
// reducers themselves, so that record/ and analysis/ depend on the buckets and not on communication.
#pragma once
#include <mpi.h>

#include <array>
#include <cstdint>
#include <vector>

#include "runtime/choices.h"

namespace ddplab {

// One bucket: the gradient pieces [first_piece, last_piece] (in ready order), which occupy the elements
// [offset, offset + count) of the flat gradient buffer, with the alignment gaps between them (model/parameters.h:
// zeros).
struct Bucket {
  int first_piece = 0, last_piece = 0;
  int64_t offset = 0, count = 0;
  int num_pieces() const { return last_piece - first_piece + 1; }
};

// How a cap closes a bucket (--bucket-rule). kWithin: a bucket stays within its cap, and a piece past the cap gets
// a bucket of its own (ddplab's). kReach: a bucket takes pieces until it reaches its cap, the piece that reaches it
// included (PyTorch DDP's compute_bucket_assignment_by_size), so a bucket passes its cap by less than one piece.
enum class BucketRule { kWithin, kReach };
constexpr std::array<Named<BucketRule>, 2> choice_names(BucketRule) {
  return {{{BucketRule::kWithin, "within"}, {BucketRule::kReach, "reach"}}};
}

// The caps a layout is cut at, in fp32 bytes a bucket spans (pieces and the gaps between them); 0: a bucket per
// piece. The two ends may have caps of their own (--first-bucket-mb, --last-bucket-mb): the first bucket to become
// ready starts communication early if small (PyTorch DDP caps it at 1 MiB); the last, which closes backward, is the
// tail no backward hides, and is short if small (ddplab caps it at 1 MiB). kAsTheOthers: no cap of its own, the end
// cut in ready order as the other buckets are (both ends so: PyTorch's layout without its first-bucket cap).
struct BucketCaps {
  static constexpr double kAsTheOthers = -1;
  double bucket_bytes = 0;            // every bucket that is not an end with a cap of its own
  double first_bytes = kAsTheOthers;  // bucket 0, the first to become ready (the last layers')
  double last_bytes = kAsTheOthers;   // the bucket that closes backward (the first layers'), the last to launch
  BucketRule rule = BucketRule::kWithin;
  // From MiB, where a negative end is kAsTheOthers.
  static BucketCaps mib(double bucket_mb, double first_mb, double last_mb, BucketRule rule = BucketRule::kWithin) {
    const auto bytes = [](double mb) { return mb < 0 ? kAsTheOthers : mb * 1048576.0; };
    return {bucket_mb * 1048576.0, bytes(first_mb), bytes(last_mb), rule};
  }
};

// Buckets over gradient pieces given in the order backward finalises them (numel and flat-buffer offset of each).
// With a cap of its own, the last bucket, which closes backward, is filled first, from the last piece backwards, to
// caps.last_bytes. Then, in ready order, bucket 0 to caps.first_bytes (or the others' cap), and the rest to
// caps.bucket_bytes; each cap closes its bucket by caps.rule, and every bucket holds one piece at least. Pieces must
// lie in ascending order without overlapping (checked: throws otherwise); a bucket is one slice of the flat buffer,
// gaps included.
std::vector<Bucket> assign_buckets(const std::vector<int64_t>& numel, const std::vector<int64_t>& offset,
                                   const BucketCaps& caps);

// Collective over comm: throws on every rank, naming each rank's bucket count, unless every rank has the same
// layout (the all-reduces would otherwise pair unrelated buffers). Shared by the Reducer and the CudaReducer.
void check_same_layout(const std::vector<Bucket>& buckets, MPI_Comm comm);

// A step's countdown over the buckets' pieces, for the Reducer and the CudaReducer alike: backward marks each piece
// ready once, a bucket is complete when all its pieces are, and buckets launch strictly in index order (the ranks'
// all-reduces pair by order), so a bucket complete early waits for its predecessors. `who` names the reducer in
// errors.
class BucketCountdown {
 public:
  BucketCountdown(const std::vector<Bucket>& buckets, const char* who);
  void restart();  // a step begins: every piece pending, nothing launched
  int bucket_of(int piece) const { return bucket_of_piece_.at(static_cast<size_t>(piece)); }
  // Piece `piece` is final: whether its bucket is now complete. Throws std::logic_error if it was marked already.
  bool mark_ready(int piece);
  // The next bucket in index order, if it is complete and not launched yet (it counts as launched now), else -1.
  int next_to_launch();
  // Before the buckets are awaited: throws std::logic_error naming the first incomplete bucket unless every piece
  // was marked ready (backward skipped a hook: DDP's "unused parameter" error).
  void require_all_ready() const;

 private:
  std::vector<Bucket> buckets_;
  const char* who_;
  std::vector<int> bucket_of_piece_;
  std::vector<int> pending_;             // per bucket: pieces not yet final
  std::vector<unsigned char> is_ready_;  // per piece: marked in this step
  int next_launch_ = 0;
};

// When things happened to one bucket in one step, in ms on the caller's time origin.
struct BucketTimes {
  double ready_ms = 0;       // its last gradient became final
  double comm_start_ms = 0;  // the communication thread started its all-reduce
  double comm_end_ms = 0;
  // CPU time the communication thread spent on that all-reduce (CLOCK_THREAD_CPUTIME_ID): the cores it took from
  // backward's threads when they ran beside it. 0 at world size 1 (no comm thread); < 0: not recorded (the CUDA
  // reducer, files written before it was).
  double comm_cpu_ms = kNotRecorded;
  static constexpr double kNotRecorded = -1;
  // --zero-stage 1: the parameters' all-gather after the update (comm_start/end_ms then time the reduce-scatter).
  // Both 0 when there was none.
  double gather_start_ms = 0, gather_end_ms = 0;
};

}  // namespace ddplab
