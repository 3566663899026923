// ncclAllReduce on a dedicated communication stream, the library collective beside our ring (after llm.c's
// multi_gpu_async_reduce_gradient): when a bucket's gradients are final on the compute stream, record an event
// there, make the comm stream wait on it and launch the all-reduce on the comm stream. The host never blocks;
// before the optimizer the compute stream waits on the comm stream (wait()).
//
// One NcclAllreduce per rank, one GPU per rank: NCCL refuses two ranks on one GPU ("Duplicate GPU detected"), so
// the constructor checks that first and throws a message pointing to --comm ring (CUDA IPC lets ranks share a GPU).
// The CUDA reducer drives it through StreamAllreduce (comm/stream_allreduce.h), as it drives our ring.
// Not thread-safe; the current device of the calling thread must be device() (the constructor sets it).
// Plain C++ header: CUDA types appear only as the opaque cudaStream_t / cudaEvent_t.
#pragma once
#include <cuda_runtime_api.h>
#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "comm/stream_allreduce.h"
#include "kernels/float16.h"

struct ncclComm;  // nccl.h: typedef struct ncclComm* ncclComm_t

namespace ddplab::cuda {

// What the calls since begin_step() were, in launch order (the Reducer's per-bucket timing rows).
struct AllreduceRecord {
  int tag = -1;      // the caller's name for it, the bucket index for the Reducer
  size_t count = 0;  // floats
  bool average = false;
  AllreduceEvents events;
};

class NcclAllreduce final : public StreamAllreduce {
 public:
  // Collective over `comm` (every rank must call): device = node-local rank % device count, then cudaSetDevice;
  // throws std::runtime_error on every rank if two ranks of a node would share a GPU, if no device is usable, or
  // if NCCL fails to bootstrap (ncclUniqueId from rank 0 via MPI_Bcast, then ncclCommInitRank).
  // wire: a 16-bit wire (--comm-dtype bf16 | fp16): each call casts data into a staging buffer of that format
  // (kernels/cuda/wire_cast.h), all-reduces it as ncclBfloat16 / ncclFloat16 and casts the reduced words back into
  // data, so memory stays fp32 and every rank decodes the same words to the same bits. The staging buffer grows to
  // the largest call, stream-ordered on the comm stream.
  explicit NcclAllreduce(MPI_Comm comm, std::optional<float16::Format> wire = std::nullopt);
  ~NcclAllreduce();  // ncclCommDestroy after the comm stream drains; ncclCommAbort if NCCL reported an error
  NcclAllreduce(const NcclAllreduce&) = delete;
  NcclAllreduce& operator=(const NcclAllreduce&) = delete;

  const char* name() const override { return "nccl"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int device() const override { return device_; }
  cudaStream_t stream() const override { return stream_; }  // the comm stream, named "ddplab comm" in NVTX
  ncclComm* nccl_comm() const { return comm_; }    // an ncclComm_t, e.g. for NCCL send/recv transports

  // data[i] = sum over ranks (average: sum / size) of data[i], in place on the comm stream, after all work queued
  // on compute_stream so far. Returns at once. Every rank must make the same calls in the same order with the same
  // count (NCCL matches collectives by order). count == 0 launches nothing but still records the events.
  // average uses ncclAvg, which for floats pre-multiplies each input by 1/size before summing: exactly sum / size
  // when size is a power of two and the sum is exact, otherwise within a rounding of it.
  // `tag` names the call in the NVTX range ("allreduce bucket <tag>") and in records().
  AllreduceEvents allreduce_async(float* data, size_t count, bool average, cudaStream_t compute_stream, int tag = -1) {
    return launch(data, count, average, 1.0f, compute_stream, tag, nullptr);
  }
  // The reducer's call: the sum (ncclSum), with `scale` applied where split_scale says.
  AllreduceEvents allreduce_scaled_async(float* data, size_t count, float scale, cudaStream_t compute_stream, int tag,
                                         const CommEpilogue& epilogue) override {
    return launch(data, count, /*average=*/false, scale, compute_stream, tag, epilogue);
  }

  // compute_stream waits (on the device, not the host) for every all-reduce launched so far: call before the
  // optimizer reads the gradients.
  void wait(cudaStream_t compute_stream) override;
  // The host waits for the comm stream; throws if NCCL reported an asynchronous error. Polls rather than blocking
  // inside CUDA, so an error (a peer died) is seen while waiting, and the watchdog (runtime/watchdog.h) names the wait
  // and, past --timeout-s, aborts the NCCL communicator before the job.
  void synchronize() override;
  // Throws NCCL's reason if the communicator reported an asynchronous error (a peer died, a network fault), and
  // marks it failed, so that the destructor aborts it: the check a host that polls a stream with NCCL work on it
  // makes between polls (synchronize, and our ring over NCCL send/recv).
  void check_async_error();

  // A timing-enabled event from the pool recorded on `stream` now, e.g. at step start on the compute stream, the
  // origin against which the Reducer resolves ready/start/end. Valid until begin_step().
  cudaEvent_t mark(cudaStream_t stream) override;
  // The calls since begin_step(), in launch order.
  const std::vector<AllreduceRecord>& records() const { return records_; }
  // Recycles every pooled event and clears records(): call once per step, after its timings have been resolved.
  // (Re-recording an event still pending is legal; earlier waits on it keep what they captured.)
  void begin_step() override;
  bool idle() override;

  // start -> end of the most recent call; synchronizes on its end event. Throws if there has been no call.
  float last_elapsed_ms();

  // "" if an NcclAllreduce can be made in this process, else why not (no CUDA device, NCCL too old), for test
  // skips and for the CLI. Does not check the per-node GPU count: that needs the communicator.
  static std::string availability();

 private:
  // Both calls above: epilogue(comm stream, scale left), if given, is enqueued right after the all-reduce, before
  // the end event.
  AllreduceEvents launch(float* data, size_t count, bool average, float scale, cudaStream_t compute_stream, int tag,
                         const CommEpilogue& epilogue);
  void release(bool abort) noexcept;
  uint16_t* wire_staging(size_t count);  // at least count words, stream-ordered on the comm stream

  int rank_ = 0, size_ = 1, device_ = -1;
  ncclComm* comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t done_ = nullptr;     // re-recorded on the comm stream by wait(); timing disabled
  EventPool events_;
  std::vector<AllreduceRecord> records_;
  std::optional<float16::Format> wire_;
  uint16_t* wire_staging_ = nullptr;  // cudaMallocAsync'd on the comm stream
  size_t wire_capacity_ = 0;          // words
  bool failed_ = false;  // an NCCL call failed: the destructor aborts instead of destroying
  int abort_hook_ = -1;   // the watchdog's ncclCommAbort of comm_
};

}  // namespace ddplab::cuda
