// What the CUDA reducer (ddp/reducer_cuda.h) needs from an all-reduce engine on the GPU, so that it runs over NCCL's
// collective (comm/nccl_allreduce.h) or our ring (comm/ring_cuda.h) alike: bucket all-reduces launched on a
// dedicated communication stream, each after the compute stream has made the bucket's gradients final, with CUDA
// events for the per-bucket timings, and the compute stream made to wait before the optimizer.
//
// Plain C++ header: CUDA types appear only as the opaque cudaStream_t / cudaEvent_t.
#pragma once
#include <cuda_runtime_api.h>
#include <mpi.h>

#include <cstddef>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "kernels/float16.h"

namespace ddplab::cuda {

// The CUDA events of one all-reduce, valid until the engine's begin_step(). All three have timing enabled: resolve
// them after the step (elapsed_ms from a step-start marker), never inside backward (cudaEventElapsedTime on an event
// not yet reached fails with cudaErrorNotReady).
struct AllreduceEvents {
  cudaEvent_t ready = nullptr;  // on the compute stream: the bucket's gradients are final
  cudaEvent_t start = nullptr;  // on the comm stream once it may begin: after `ready` and after every earlier call
  cudaEvent_t end = nullptr;    // on the comm stream after the all-reduce and its epilogue
};

// Work enqueued on the comm stream right behind one all-reduce (the reducer's scale-and-check kernel). It multiplies
// the buffer by `scale`: what the engine left of the call's scale for after the sum (1 where it applied all of it).
using CommEpilogue = std::function<void(cudaStream_t comm_stream, float scale)>;

// Where an engine applies a call's scale on its wire (none: fp32): all of it before the sum on an fp16 wire, whose
// range a sum of large gradients overflows (wire::scales_before_sum, as the host Communicator does), else all of it
// after, in the epilogue. Throws std::invalid_argument where a scale other than 1 is left with no epilogue to apply it.
struct ScaleAroundSum {
  float before = 1.0f, after = 1.0f;
};
ScaleAroundSum split_scale(std::optional<float16::Format> wire, float scale, bool has_epilogue);

class StreamAllreduce {
 public:
  virtual ~StreamAllreduce() = default;
  virtual const char* name() const = 0;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual int device() const = 0;
  virtual cudaStream_t stream() const = 0;  // the comm stream

  // data[i] = scale × (sum over ranks of data[i]), in place, on the comm stream after everything queued on
  // compute_stream so far, the scale applied where split_scale says, then epilogue(comm stream, what is left of
  // the scale). Launches and returns; the host does not wait for the data. Every rank makes the same calls in the
  // same order with the same counts and scales. tag names the call (NVTX range, errors).
  virtual AllreduceEvents allreduce_scaled_async(float* data, size_t count, float scale, cudaStream_t compute_stream,
                                                 int tag, const CommEpilogue& epilogue) = 0;
  // compute_stream waits, on the device, for every all-reduce launched so far: call before the optimizer.
  virtual void wait(cudaStream_t compute_stream) = 0;
  // Blocks the host until the all-reduce whose end event is `end` has its events recorded on the comm stream (our
  // ring's comm thread records them when it runs the job; NCCL at once), so that another stream may wait for it.
  virtual void wait_recorded(cudaEvent_t end) { (void)end; }
  // The host waits until every all-reduce launched so far has finished; throws what failed. A watchdog-named wait
  // (runtime/watchdog.h).
  virtual void synchronize() = 0;
  // A timing event from the engine's pool, recorded on `stream` now (the step's origin on the compute stream).
  virtual cudaEvent_t mark(cudaStream_t stream) = 0;
  // Recycles the pooled events: once per step, after its timings have been resolved.
  virtual void begin_step() = 0;
  // Nothing launched is still queued or running and nothing failed, so destroying the engine now waits for no peer
  // and leaves no work on the buffers it was given. Does not block.
  virtual bool idle() = 0;
};

// Timing events handed out per step and recycled by reset(), so a step creates none. Not thread-safe.
class EventPool {
 public:
  EventPool() = default;
  ~EventPool();
  EventPool(const EventPool&) = delete;
  EventPool& operator=(const EventPool&) = delete;
  cudaEvent_t get();  // timing enabled
  void reset() { used_ = 0; }

 private:
  std::vector<cudaEvent_t> events_;
  size_t used_ = 0;
};

// Milliseconds from `from` to `to` (cudaEventElapsedTime); both must have completed.
float elapsed_ms(cudaEvent_t from, cudaEvent_t to);

// Blocks the host until `stream` has run everything enqueued on it so far, as a watchdog wait named `what` (a stuck
// GPU is reported like a stuck peer), calling between_polls (if set: a peer's asynchronous error, which throws)
// between polls. Spins for the first 200 us, then sleeps between polls: in the device VM a 20 us sleep lasted ~80
// us, which was the whole time of a small all-reduce (NCCL np 1, 8 bytes: 82 us per call vs 1.6 us in place).
void wait_for_stream(cudaStream_t stream, const char* what, const std::function<void()>& between_polls = nullptr);

// Every rank of comm learns whether any failed, so that all throw together instead of some waiting in a later
// collective: throws "rank R: <who>: <local_error>" on a rank that failed, "...: another rank failed" on the others.
void agree_or_throw(MPI_Comm comm, const std::string& who, const std::string& local_error);

// "" where the CUDA runtime sees a device, else "no CUDA device: " and its reason (the runtime's error is cleared);
// count (if given) gets the number of devices it sees.
std::string missing_cuda_device(int* count = nullptr);

// A communication stream: non-blocking, of the highest priority, so that the block scheduler prefers its kernels
// whenever compute's leave room and an all-reduce runs beside backward instead of queueing behind it; named for
// NVTX timelines.
cudaStream_t create_comm_stream(const char* name);

// This rank's GPU: node-local rank modulo the node's device count, made current (cudaSetDevice). Collective over
// comm; throws on every rank if any rank has no usable device, or, with exclusive, if two ranks of a node would share
// one GPU (NCCL refuses that: "Duplicate GPU detected"), with a message naming them.
struct DeviceChoice {
  int device = -1;
  int local_rank = 0;
  int local_size = 1;
  int device_count = 0;
  bool gpu_shared = false;  // some GPU serves two ranks, on any node (the same on every rank)
};
DeviceChoice choose_device(MPI_Comm comm, bool exclusive, const char* who);

}  // namespace ddplab::cuda
