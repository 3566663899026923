// Our ring all-reduce on GPU buffers (--device cuda --comm ring): the device ring of comm/ring_device.h — the host
// ring's schedule, one exchange per step, the reduction in our own kernel (kernels/cuda/elementwise.h:
// residual_forward) — on a CUDA stream, or its recursive doubling where exchanges are what costs (doubles() below),
// over one of three links:
//   nccl  ncclSend/ncclRecv in a group per step. Never blocks the host; one GPU per rank (NCCL's rule).
//   ipc   CUDA IPC: each rank writes into the receiver's staging buffer, mapped with cudaIpcOpenMemHandle, with
//         MPI tokens between the pair (PeerStagingLink). Every rank on one node; ranks may SHARE a GPU,
//         which NCCL refuses, so `mpirun -np 4` trains on a one-GPU machine.
//   host  device -> pinned host -> MPI -> device (HostStagedLink): the last fallback, any placement.
// The ipc and host links block the host inside each exchange, so RingAllreduceCuda runs the ring on a comm thread of
// its own: allreduce_sum_async queues a job and returns, as NCCL's does, and the reducer does not care which.
#pragma once
#include <cuda_runtime_api.h>
#include <mpi.h>

#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "comm/communicator.h"
#include "comm/ring_device.h"
#include "comm/stream_allreduce.h"
#include "comm/transport.h"
#include "kernels/cuda/owned.h"
#include "runtime/worker_thread.h"

struct ncclComm;  // nccl.h: typedef struct ncclComm* ncclComm_t

namespace ddplab::cuda {

class NcclAllreduce;

// kAuto: the first link of the table (ring_cuda.cpp: ipc, nccl, host) that can connect.
using ddplab::RingLinkKind;  // comm/communicator.h: the names --ring-link takes

// RingMemory on a CUDA stream: cudaMemcpyAsync and the add kernel are enqueued; synchronize() polls the stream
// (a watchdog-named wait, so a stuck GPU is reported like a stuck peer), calling check() between polls: over the
// NCCL link, NCCL's asynchronous error, so that a dead peer fails the wait with NCCL's reason instead of hanging.
class CudaStreamMemory final : public RingMemory {
 public:
  explicit CudaStreamMemory(cudaStream_t stream, std::function<void()> check = nullptr)
      : stream_(stream), check_(std::move(check)) {}
  void set_check(std::function<void()> check) { check_ = std::move(check); }
  void copy(void* dst, const void* src, size_t bytes) override;
  void add(float* out, const float* a, const float* b, size_t count) override;
  void encode(float16::Format f, uint16_t* dst, const float* src, size_t count) override;
  void decode(float16::Format f, float* dst, const uint16_t* src, size_t count) override;
  void add_encode(float16::Format f, uint16_t* io, const float* own, size_t count) override;
  void synchronize() override;

 private:
  cudaStream_t stream_;
  std::function<void()> check_;
};

// One ring step as a group of ncclSend to next and ncclRecv from prev, on the stream.
class NcclP2pLink final : public RingLink {
 public:
  NcclP2pLink(ncclComm* comm, int rank, int size, cudaStream_t stream, size_t max_bytes)
      : comm_(comm), rank_(rank), size_(size), stream_(stream), max_bytes_(max_bytes) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  size_t max_bytes() const override { return max_bytes_; }
  void send_recv(int to, const void* send, size_t send_bytes, int from, void* recv, size_t recv_bytes) override;
  const char* name() const override { return "nccl"; }
  bool queues_without_host_waits() const override { return true; }

 private:
  ncclComm* comm_;
  int rank_, size_;
  cudaStream_t stream_;
  size_t max_bytes_;  // bounds the chunk (and the primitives' staging), not NCCL
};

struct CudaRingConfig {
  RingLinkKind link = RingLinkKind::kAuto;
  // The largest chunk one step moves: the ring runs in rounds of ranks x this (recursive doubling: of this), and each
  // staging buffer holds one.
  // Each step of the ipc and host links costs a fixed ~0.37 ms where the ranks share a GPU (its contexts take
  // turns), whatever it moves: at 2 ranks on an H200 a 256 MiB all-reduce ran at 10.5 GB/s bus bandwidth in 4 MiB
  // chunks and 107 GB/s in 64 MiB ones (docs/BENCHMARKS.md, "GPU collectives and overlap"). So 64 MiB: a few staging
  // buffers of that size per rank.
  size_t chunk_bytes = kGpuRingChunkBytes;
  // A 16-bit wire (--comm-dtype bf16 | fp16): the ring's WireRingPrimitives, the same chunks in half the bytes.
  std::optional<float16::Format> wire = std::nullopt;
  // --link: every exchange also takes as long as it would on these links (LinkEmulatedRingLink, comm/ring_device.h),
  // each hop's class from the nodes: hosts, or emulated nodes of ranks_per_node consecutive ranks (0: hosts).
  LinkClasses links{};
  int ranks_per_node = 0;
};

class RingAllreduceCuda final : public StreamAllreduce {
 public:
  // Collective over comm (which must outlive it): picks this rank's GPU (shared allowed except for the nccl link),
  // creates the comm stream and the link's buffers (ipc: exchanges the memory handles over MPI and maps every other
  // rank's). Throws on every rank if any rank fails, e.g. ipc with ranks on several nodes.
  RingAllreduceCuda(MPI_Comm comm, const CudaRingConfig& config);
  ~RingAllreduceCuda() override;
  RingAllreduceCuda(const RingAllreduceCuda&) = delete;
  RingAllreduceCuda& operator=(const RingAllreduceCuda&) = delete;

  // "ring/ipc", ...; for --ring-link auto, with the links passed over and why: "ring/host (ipc: ...; nccl: ...)";
  // " + recursive doubling" where some buffers take it (doubles()), " + link emulation" under --link.
  const char* name() const override { return name_.c_str(); }
  // Whether `count` floats are all-reduced by recursive doubling (doubling_allreduce_sum, comm/ring_device.h) rather
  // than the ring: where it takes fewer exchanges at two ranks or with ranks sharing a GPU, unless an emulated link
  // times the exchanges by their bytes (gpu_ring_doubles, comm/communicator.h). The same on every rank.
  bool doubles(size_t count) const {
    return gpu_ring_doubles(size_, exchanges_cost_a_fixed_time_, static_cast<double>(count * sizeof(float)),
                            static_cast<double>(chunk_bytes_));
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int device() const override { return device_; }
  cudaStream_t stream() const override { return stream_; }
  AllreduceEvents allreduce_scaled_async(float* data, size_t count, float scale, cudaStream_t compute_stream, int tag,
                                         const CommEpilogue& epilogue) override;
  // Blocks the host until the comm thread has queued every job's work on the comm stream, then makes
  // compute_stream wait for it on the device.
  void wait(cudaStream_t compute_stream) override;
  void wait_recorded(cudaEvent_t end) override;
  void synchronize() override;
  cudaEvent_t mark(cudaStream_t stream) override;
  void begin_step() override {
    events_.reset();
    tickets_.clear();
  }
  bool idle() override;

  // out = sum over ranks of in (out == in: in place) on the calling thread, and waits for it: for benchmarks and
  // tests, never while asynchronous all-reduces are in flight.
  void allreduce_sum(const float* in, float* out, size_t count);
  // The same queued on the comm stream without waiting for it: what a CUDA graph captures (allreduce_perf -G). Where
  // queues_whole() only (the nccl link, unemulated): the ipc and host links, and an emulated link's sleeps, make the
  // host wait inside each exchange (std::logic_error).
  void enqueue_allreduce_sum(const float* in, float* out, size_t count);
  bool queues_whole() const { return link_->queues_without_host_waits(); }

 private:
  void wait_for_jobs(const char* what);
  const DeviceRingWire* wire() const { return wire_ ? &*wire_ : nullptr; }
  struct LinkEntry;
  static const std::vector<LinkEntry>& link_table();
  const LinkEntry& choose_link(MPI_Comm comm, RingLinkKind wanted);
  // The rest of the constructor, after the stream: its event, staging and the chosen link over `chunk_bytes_`.
  void open_link(MPI_Comm comm, const CudaRingConfig& config, const LinkEntry& link);
  void destroy_stream_and_event() noexcept;
  void open_ipc_link(MPI_Comm comm, size_t bytes);
  void map_peer_staging(MPI_Comm comm, size_t bytes);
  // Unmaps every other rank's staging buffer. Mine is freed (with the members) only after a barrier where every rank
  // unmaps it too; otherwise it is leaked on purpose, as a peer may still have it mapped and a barrier with a dead
  // peer would wait forever (a failed job ends the process anyway).
  void unmap_peer_staging(bool every_rank_unmaps) noexcept;
  // The chosen algorithm, enqueued on the comm stream; tag: the bucket, which the link's messages carry.
  void run(const float* in, float* out, size_t count, int tag);
  void open_nccl_link(MPI_Comm comm, size_t bytes);
  void open_host_link(MPI_Comm comm, size_t bytes);

  int rank_ = 0, size_ = 1, device_ = -1;
  bool ranks_share_a_gpu_ = false;
  bool exchanges_cost_a_fixed_time_ = false;  // ranks share a GPU, and no emulated link times the exchanges
  size_t chunk_bytes_ = 0;
  std::string name_;
  MPI_Comm comm_ = MPI_COMM_NULL;        // the caller's; must outlive this object (the IPC teardown's barrier)
  std::unique_ptr<NcclAllreduce> nccl_;  // the nccl link's communicator (and device choice)
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<CudaStreamMemory> memory_;
  std::unique_ptr<MpiTransport> transport_;                  // ipc tokens / host-staged data
  cuda::DeviceMemory reduce_staging_;                        // the primitives' incoming chunk
  cuda::DeviceMemory wire_words_;                            // 16-bit wire: its two chunk buffers, back to back
  std::optional<DeviceRingWire> wire_;
  cuda::DeviceMemory ipc_staging_;       // ipc: mine, written by the rank sending to me
  std::vector<void*> peer_ipc_staging_;  // ipc: every other rank's, mapped here (mine: null)
  std::unique_ptr<void, cuda::CudaFreeHost> host_send_, host_recv_;  // host: pinned
  std::unique_ptr<RingLink> link_;
  EventPool events_;  // main thread only; the comm thread only records the events it is handed
  cudaEvent_t done_ = nullptr;
  std::vector<std::pair<cudaEvent_t, uint64_t>> tickets_;  // this step's jobs: their end event, their comm thread ticket
  std::unique_ptr<WorkerThread> comm_thread_;  // started once the link is up; stopped first
};

}  // namespace ddplab::cuda
