// The Reducer: gradient buckets all-reduced while backward is still running (after PyTorch DDP's Reducer and
// llm.c's multi-GPU path).
//
//   - Buckets are runs of gradient pieces in the order backward finalises them — REVERSE registration order of
//     the parameters; a piece is a whole parameter, or with --grad-slice-mb a block of rows of a large weight
//     (model/parameters.h) — up to a byte cap. Each end may have a cap of its own (ddp/buckets.h): the last bucket,
//     which closes backward (it holds the first layers, whose gradients arrive last), 1 MiB by default, so that the
//     communication left after backward is short; the first to become ready, as PyTorch's 1 MiB first bucket, so
//     that the first all-reduce starts early (by default cut as the others here).
//   - The model keeps all gradients in one flat buffer laid out in that same reverse order (model/parameters.h), so a
//     bucket is a contiguous slice of it: the all-reduce runs on a view, with no copy in or out.
//   - Backward calls mark_ready(piece) as each piece of gradient becomes final. When a bucket is complete it is
//     handed to the communication thread at once (overlap on), in bucket order on every rank; the step waits for all
//     buckets only before the optimizer (wait_all). With overlap off, every bucket starts in wait_all, after
//     backward: the baseline to compare against.
//   - Gradient accumulation (no_sync): with set_sync(false) mark_ready does nothing and gradients accumulate
//     locally; the micro-batch with set_sync(true) communicates. Gradients are scaled by 1/(world * micro-batches).
#pragma once
#include <mpi.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "comm/communicator.h"
#include "ddp/buckets.h"
#include "runtime/owned_comm.h"
#include "runtime/worker_thread.h"

namespace ddplab {

struct ReducerConfig {
  // The caps and overlap come from the run's flags (--bucket-mb, --first-bucket-mb, --last-bucket-mb, --overlap:
  // config/train_config.h, where their defaults are).
  BucketCaps caps;
  bool overlap;
  // --zero-stage 1, the sharded update (comm/ring_allreduce.h): each bucket is reduce-scattered instead of
  // all-reduced, so a rank holds the mean gradients only where it owns the elements (owned_chunks); it zeroes the
  // rest, updates its own, and all_gather() sends the new parameters round.
  bool sharded = false;
};

class Reducer {
 public:
  // Collective over comm: every rank must construct its Reducer with the same layout, which is checked (a
  // mismatch throws on every rank, naming each rank's bucket count: check_same_layout).
  // numel/offset: the gradient pieces in ready order (see assign_buckets).
  Reducer(Communicator& comm, const ReducerConfig& config, const std::vector<int64_t>& numel,
          const std::vector<int64_t>& offset, float* flat_grads);
  ~Reducer();
  Reducer(const Reducer&) = delete;
  Reducer& operator=(const Reducer&) = delete;

  const std::vector<Bucket>& buckets() const { return buckets_; }
  const ReducerConfig& config() const { return config_; }

  // Starts a step's communication round: every bucket pending. `origin_ms` is the time origin of the returned
  // timings (now_ms() values minus origin). `local_scale` multiplies this rank's gradients before the sum (its
  // share of the global loss, when ranks' batches count differently), `grad_scale` the summed gradients
  // (1/(world*micro)).
  void begin_step(double origin_ms, float grad_scale, float local_scale = 1.0f);
  // false: gradients only accumulate (no_sync); true: complete buckets are reduced.
  void set_sync(bool sync) { sync_ = sync; }
  // Backward's hook: gradient piece `piece` (index in ready order) is final.
  void mark_ready(int piece);
  // Blocks until every bucket of this step is reduced (starting them first when overlap is off). Rethrows an
  // error of the communication thread. At world size 1 there is no communication thread and no all-reduce: a
  // bucket is final when launched, its comm time recorded as exactly zero; what is left (the mean's factor and the
  // finiteness check) is done piece by piece, as each piece becomes final (overlap off: here).
  void wait_all();
  // Timings of the last step, one entry per bucket.
  const std::vector<BucketTimes>& bucket_times() const { return times_; }
  // Called in a synchronizing step when gradient pieces [first_piece, last_piece] are final (summed, scaled and
  // checked), on the thread that finished them: per bucket on the comm thread; at world size 1 per piece, on the
  // finisher (below) or the caller of mark_ready/wait_all. `finite`: they hold no NaN or Inf. Set before the first
  // step.
  using ReducedHook = std::function<void(int first_piece, int last_piece, bool finite)>;
  void set_on_reduced(ReducedHook hook) { on_reduced_ = std::move(hook); }
  // --zero-stage 1: the elements of the flat buffer this rank owns in `bucket` (offsets into the flat buffer; all of
  // them at world size 1). After wait_all they hold the mean gradients and every other element of the bucket is 0.
  const std::vector<RingChunk>& owned_chunks(int bucket) const { return owned_.at(bucket); }
  // --zero-stage 1: hands `flat`'s slice of `bucket` to the comm thread, to give every element its owner's value
  // (the updated parameters; before a checkpoint, the optimizer's moments). Collective, in the same bucket order on
  // every rank; wait_all_gathers() waits for them and rethrows a comm thread's error. Nothing to do at world size 1.
  void all_gather(int bucket, float* flat);
  void wait_all_gathers();
  // World size 1: the thread that finishes each piece but the last (scales and checks it) instead of the caller of
  // mark_ready, so that the pass leaves backward's critical path (--optimizer-in-backward's thread, which then
  // updates the piece). wait_all waits for it. Ignored at larger world sizes, where the comm thread finishes each
  // bucket.
  void set_alone_finisher(WorkerThread* finisher) { alone_finisher_ = finisher; }
  // After wait_all, collective when sharded: the first gradient piece of first_nonfinite_bucket() holding a NaN or
  // Inf, or -1 (none, or none found). Sharded, each rank looks where it owns the elements and the ranks agree on the
  // first (a MIN), so every rank names the same piece.
  int first_nonfinite_piece();
  // After wait_all: the first bucket whose reduced gradients hold a NaN or Inf, or -1. The communication thread
  // checks each bucket right after its all-reduce, while the data is in cache and backward still runs. Every rank
  // reduces to the same values, so every rank gets the same answer (sharded, each checks what it owns, and wait_all
  // agrees on the verdicts in one small all-reduce).
  int first_nonfinite_bucket() const;
  // After wait_all, collective when sharded: the sum of squares of the reduced gradients (--grad-clip's norm, squared),
  // the same bits on every rank. Replicated, each rank sums every bucket; sharded, each rank sums what it alone holds
  // (its owned chunks of the sharded buckets, and on rank 0 the buckets too small to shard, which every rank holds
  // whole), and the ranks' sums are added in rank order.
  double sum_of_squares() const;

 private:
  void launch(int bucket);
  void finish_alone(int piece);  // world size 1: scales and checks the piece, on the finisher if there is one
  void reduce(int bucket);       // on the comm thread

  Communicator& comm_;
  ReducerConfig config_;
  std::vector<Bucket> buckets_;
  BucketCountdown countdown_;  // main thread: this step's pieces, and which bucket launches next
  std::vector<int64_t> piece_numel_, piece_offset_;
  std::vector<std::vector<RingChunk>> owned_;  // per bucket (sharded)
  OwnedComm verdicts_;                         // sharded, world > 1: a private duplicate for the verdicts' agreement
  float* flat_grads_;

  // Main-thread state of the current step.
  bool sync_ = true;
  double origin_ms_ = 0;
  float grad_scale_ = 1, local_scale_ = 1;
  std::vector<BucketTimes> times_;
  // Per bucket, written by the thread that finishes it (the comm thread or the finisher) before its job counts done.
  std::vector<int> nonfinite_;  // int: MPI_MAX is defined for it (sharded: agreed across ranks)
  // At one rank the closing bucket's last piece is finished on the caller's thread while the finisher may still
  // finish its others: their writes of the bucket's flag (the rare non-finite path) take this.
  std::mutex nonfinite_mutex_;
  ReducedHook on_reduced_;
  WorkerThread* alone_finisher_ = nullptr;
  uint64_t last_finish_ticket_ = 0;  // this step's last job on alone_finisher_

  std::unique_ptr<WorkerThread> comm_thread_;  // world size > 1: the buckets' collectives, in launch order
};

}  // namespace ddplab
