// The ring on GPU buffers: see ring_cuda.h. Host code only (its kernels are elementwise.h's residual_forward and
// scale, and wire_cast.h's).
#include "comm/ring_cuda.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <cstdio>
#include <exception>
#include <stdexcept>
#include <vector>

#include "comm/link_emulation.h"
#include "comm/nccl_allreduce.h"
#include "kernels/cuda/check.cuh"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/nvtx.h"
#include "kernels/cuda/wire_cast.h"
#include "runtime/mpi_check.h"
#include "runtime/watchdog.h"

namespace ddplab::cuda {

void CudaStreamMemory::copy(void* dst, const void* src, size_t bytes) {
  if (bytes) cudaCheck(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream_));
}

void CudaStreamMemory::add(float* out, const float* a, const float* b, size_t count) {
  residual_forward(out, a, b, static_cast<int64_t>(count), stream_);  // out = a + b
}

void CudaStreamMemory::encode(float16::Format f, uint16_t* dst, const float* src, size_t count) {
  wire_encode(f, dst, src, static_cast<int64_t>(count), stream_);
}

void CudaStreamMemory::decode(float16::Format f, float* dst, const uint16_t* src, size_t count) {
  wire_decode(f, dst, src, static_cast<int64_t>(count), stream_);
}

void CudaStreamMemory::add_encode(float16::Format f, uint16_t* io, const float* own, size_t count) {
  wire_add_encode(f, io, own, static_cast<int64_t>(count), stream_);
}

void CudaStreamMemory::synchronize() {
  wait_for_stream(stream_, "the ring's copies and adds on the comm stream", check_);
}

void NcclP2pLink::send_recv(int to, const void* send, size_t send_bytes, int from, void* recv, size_t recv_bytes) {
  // One group: both directions progress together, so no rank's send waits for a receive that is queued behind it.
  ncclCheck(ncclGroupStart());
  try {
    if (send_bytes) ncclCheck(ncclSend(send, send_bytes, ncclUint8, to, comm_, stream_));
    if (recv_bytes) ncclCheck(ncclRecv(recv, recv_bytes, ncclUint8, from, comm_, stream_));
  } catch (...) {
    ncclGroupEnd();  // the group is per thread: left open, it would swallow this thread's later NCCL calls
    throw;
  }
  ncclCheck(ncclGroupEnd());
}

namespace {

// What the links decide by: the same facts on every rank, so every rank picks the same link.
struct LinkQuery {
  int ranks;
  DeviceChoice choice;
  std::string nccl_unavailable;  // NcclAllreduce::availability() on some rank; empty: usable everywhere
};

}  // namespace

// The ring's links, tried in this order for --ring-link auto, as NCCL tries its transports per peer. The ring is one
// cycle and every rank must pick the same link, so the choice is per ring rather than per peer: ipc, the fastest
// where it can connect and the only one that lets ranks share a GPU; then nccl; then host, which always connects.
struct RingAllreduceCuda::LinkEntry {
  RingLinkKind kind;
  // Empty when the link can connect this ring; else why not.
  std::string (*cannot_connect)(const LinkQuery& q);
  // Builds the link over `bytes` chunks; collective over comm.
  void (RingAllreduceCuda::*setup)(MPI_Comm comm, size_t bytes);
};

const std::vector<RingAllreduceCuda::LinkEntry>& RingAllreduceCuda::link_table() {
  static const std::vector<LinkEntry> table = {
      {RingLinkKind::kIpc,
       [](const LinkQuery& q) -> std::string {
         if (q.choice.local_size == q.ranks) return "";
         return "ranks on more than one node (" + std::to_string(q.choice.local_size) + " of " +
                std::to_string(q.ranks) + " here), and CUDA IPC maps memory within one";
       },
       &RingAllreduceCuda::open_ipc_link},
      {RingLinkKind::kNccl,
       [](const LinkQuery& q) -> std::string {
         if (!q.nccl_unavailable.empty()) return q.nccl_unavailable;
         return q.choice.gpu_shared ? "ranks share a GPU, which NCCL refuses" : "";
       },
       &RingAllreduceCuda::open_nccl_link},
      {RingLinkKind::kHost, [](const LinkQuery&) { return std::string(); }, &RingAllreduceCuda::open_host_link},
  };
  return table;
}

// The requested link, or for auto the first that can connect; what auto passed over is said in the name.
const RingAllreduceCuda::LinkEntry& RingAllreduceCuda::choose_link(MPI_Comm comm, RingLinkKind wanted) {
  LinkQuery q{size_, choose_device(comm, /*exclusive=*/false, "ring on the GPU"), ""};
  device_ = q.choice.device;
  ranks_share_a_gpu_ = q.choice.gpu_shared;
  const std::string unavailable = NcclAllreduce::availability();
  int missing = unavailable.empty() ? 0 : 1, anywhere = 0;
  mpiCheck(MPI_Allreduce(&missing, &anywhere, 1, MPI_INT, MPI_MAX, comm));
  if (anywhere) q.nccl_unavailable = unavailable.empty() ? "NCCL unusable on another rank" : unavailable;
  std::string passed_over;
  for (const LinkEntry& entry : link_table()) {
    if (wanted != RingLinkKind::kAuto && entry.kind != wanted) continue;
    const std::string why = entry.cannot_connect(q);
    if (why.empty()) {
      name_ = std::string("ring/") + to_string(entry.kind) + (passed_over.empty() ? "" : " (" + passed_over + ")");
      return entry;
    }
    if (wanted != RingLinkKind::kAuto)
      throw std::runtime_error("rank " + std::to_string(rank_) + ": ring on the GPU: the " + to_string(wanted) +
                               " link cannot connect: " + why + " (--ring-link auto picks one that can)");
    passed_over += (passed_over.empty() ? "" : "; ") + std::string(to_string(entry.kind)) + ": " + why;
  }
  throw std::logic_error("ring on the GPU: no link in the table connects (" + passed_over + ")");
}

void RingAllreduceCuda::open_nccl_link(MPI_Comm comm, size_t bytes) {
  nccl_ = std::make_unique<NcclAllreduce>(comm);  // one GPU per rank, checked on every rank
  device_ = nccl_->device();
  link_ = std::make_unique<NcclP2pLink>(nccl_->nccl_comm(), rank_, size_, stream_, bytes);
  memory_->set_check([nccl = nccl_.get()] { nccl->check_async_error(); });  // its kernels may wait on a dead peer
}

void RingAllreduceCuda::open_host_link(MPI_Comm comm, size_t bytes) {
  transport_ = std::make_unique<MpiTransport>(comm);
  void* p = nullptr;
  cudaCheck(cudaMallocHost(&p, bytes));
  host_send_.reset(p);
  cudaCheck(cudaMallocHost(&p, bytes));
  host_recv_.reset(p);
  link_ = std::make_unique<HostStagedLink>(*memory_, *transport_, host_send_.get(), host_recv_.get(), bytes);
}

RingAllreduceCuda::RingAllreduceCuda(MPI_Comm comm, const CudaRingConfig& config) {
  mpiCheck(MPI_Comm_rank(comm, &rank_));
  mpiCheck(MPI_Comm_size(comm, &size_));
  comm_ = comm;
  const size_t bytes = config.chunk_bytes / sizeof(float) * sizeof(float);
  if (bytes == 0) throw std::invalid_argument("ring on the GPU: chunk_bytes must hold at least one float");
  chunk_bytes_ = bytes;
  const LinkEntry& link = choose_link(comm, config.link);
  const bool emulated = config.links.emulated();
  exchanges_cost_a_fixed_time_ = ranks_share_a_gpu_ && !emulated;
  if (gpu_ring_may_double(size_, exchanges_cost_a_fixed_time_)) name_ += kGpuRingDoublingName;
  if (emulated) name_ += " + link emulation";

  stream_ = create_comm_stream("ddplab comm (ring)");
  try {
    open_link(comm, config, link);
  } catch (...) {  // no destructor runs for a constructor that throws: what it made so far goes here
    unmap_peer_staging(/*every_rank_unmaps=*/false);  // the ranks that mapped some peers' buffers before one failed
    destroy_stream_and_event();
    throw;
  }
}

void RingAllreduceCuda::open_link(MPI_Comm comm, const CudaRingConfig& config, const LinkEntry& link) {
  const size_t bytes = chunk_bytes_;
  cudaCheck(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming));
  memory_ = std::make_unique<CudaStreamMemory>(stream_);
  void* p = nullptr;
  cudaCheck(cudaMalloc(&p, bytes));
  reduce_staging_.reset(p);
  if (config.wire) {
    const size_t words = bytes / sizeof(float);  // device_ring_max_chunk: the fp32 wire's chunking
    cudaCheck(cudaMalloc(&p, 2 * words * sizeof(uint16_t)));
    wire_words_.reset(p);
    uint16_t* w = static_cast<uint16_t*>(p);
    wire_ = DeviceRingWire{*config.wire, {w, w + words}};
  }

  (this->*link.setup)(comm, bytes);
  if (config.links.emulated())
    link_ = std::make_unique<LinkEmulatedRingLink>(std::move(link_),
                                                   emulated_link_clock(comm, config.links, config.ranks_per_node));
  comm_thread_ = std::make_unique<WorkerThread>("GPU ring comm thread");
  comm_thread_->submit([this] { cudaCheck(cudaSetDevice(device_)); });  // a new thread starts on device 0
}

// My staging buffer's handle goes to every rank; I map every other rank's (recursive doubling sends beyond next).
// cudaIpcOpenMemHandle works between processes on one GPU as between GPUs of a node (peer access enabled lazily
// where there is a second GPU).
void RingAllreduceCuda::open_ipc_link(MPI_Comm comm, size_t bytes) {
  transport_ = std::make_unique<MpiTransport>(comm);
  map_peer_staging(comm, bytes);
  link_ = std::make_unique<PeerStagingLink>(*memory_, *transport_, ipc_staging_.get(), peer_ipc_staging_, bytes);
}

void RingAllreduceCuda::map_peer_staging(MPI_Comm comm, size_t bytes) {
  void* p = nullptr;
  cudaCheck(cudaMalloc(&p, bytes));
  ipc_staging_.reset(p);
  cudaIpcMemHandle_t mine{};
  std::string error;
  cudaError_t err = cudaIpcGetMemHandle(&mine, p);
  if (err != cudaSuccess) error = std::string("cudaIpcGetMemHandle: ") + cudaGetErrorString(err);
  std::vector<cudaIpcMemHandle_t> all(size_);
  mpiCheck(MPI_Allgather(&mine, sizeof(mine), MPI_BYTE, all.data(), sizeof(mine), MPI_BYTE, comm));
  agree_or_throw(comm, "ring on the GPU", error);
  peer_ipc_staging_.assign(size_, nullptr);  // a process cannot open its own handle, and never sends to itself
  for (int k = 0; k < size_ && error.empty(); ++k) {
    if (k == rank_) continue;
    err = cudaIpcOpenMemHandle(&peer_ipc_staging_[k], all[k], cudaIpcMemLazyEnablePeerAccess);
    if (err != cudaSuccess) {
      cudaGetLastError();
      peer_ipc_staging_[k] = nullptr;
      error = "cudaIpcOpenMemHandle of rank " + std::to_string(k) + "'s buffer: " + cudaGetErrorString(err);
    }
  }
  agree_or_throw(comm, "ring on the GPU", error);
}

RingAllreduceCuda::~RingAllreduceCuda() {
  const bool failed = comm_thread_ && comm_thread_->failed();
  comm_thread_.reset();  // the running job finishes; those not started are dropped
  if (stream_ != nullptr) cudaStreamSynchronize(stream_);
  unmap_peer_staging(!failed && std::uncaught_exceptions() == 0 && transport_);
  destroy_stream_and_event();
}

void RingAllreduceCuda::unmap_peer_staging(bool every_rank_unmaps) noexcept {
  // Empty until every rank's handle was gathered and none failed to make its own: no rank has mapped mine before.
  if (peer_ipc_staging_.empty()) return;
  for (void* q : peer_ipc_staging_)
    if (q != nullptr) cudaIpcCloseMemHandle(q);
  peer_ipc_staging_.clear();
  cudaGetLastError();
  if (every_rank_unmaps) {
    const watchdog::Wait wait("the ring's IPC buffers to be unmapped on every rank");
    MPI_Barrier(comm_);
  } else {
    ipc_staging_.release();
  }
}

void RingAllreduceCuda::destroy_stream_and_event() noexcept {
  if (done_ != nullptr) cudaEventDestroy(done_);
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
  done_ = nullptr;
  stream_ = nullptr;
  cudaGetLastError();
}

AllreduceEvents RingAllreduceCuda::allreduce_scaled_async(float* data, size_t count, float scale,
                                                          cudaStream_t compute_stream, int tag,
                                                          const CommEpilogue& epilogue) {
  const ScaleAroundSum scaled =
      split_scale(wire_ ? std::optional(wire_->format) : std::nullopt, scale, epilogue != nullptr);
  AllreduceEvents ev;
  ev.ready = events_.get();
  ev.start = events_.get();
  ev.end = events_.get();
  cudaCheck(cudaEventRecord(ev.ready, compute_stream));
  // On the comm thread: the ipc and host links block it inside each exchange. A failure surfaces at the next wait.
  const uint64_t ticket = comm_thread_->submit([this, data, count, tag, ev, epilogue, scaled] {
    char name[48];
    std::snprintf(name, sizeof(name), "ring allreduce bucket %d", tag);
    const NvtxRange range(name);
    cudaCheck(cudaStreamWaitEvent(stream_, ev.ready, 0));
    cudaCheck(cudaEventRecord(ev.start, stream_));
    if (scaled.before != 1.0f) cuda::scale(data, scaled.before, static_cast<int64_t>(count), stream_);
    run(data, data, count, tag);
    if (epilogue) epilogue(stream_, scaled.after);
    cudaCheck(cudaEventRecord(ev.end, stream_));
  });
  tickets_.emplace_back(ev.end, ticket);
  return ev;
}

void RingAllreduceCuda::wait_recorded(cudaEvent_t end) {
  const auto it = std::find_if(tickets_.begin(), tickets_.end(), [&](const auto& t) { return t.first == end; });
  if (it == tickets_.end()) throw std::logic_error("ring on the GPU: wait_recorded of an event it did not hand out");
  const watchdog::Wait wait("the GPU ring's comm thread to run a bucket's all-reduce");
  comm_thread_->wait(it->second);
}

void RingAllreduceCuda::wait_for_jobs(const char* what) {
  const watchdog::Wait wait(what);
  comm_thread_->wait_all();
}

void RingAllreduceCuda::wait(cudaStream_t compute_stream) {
  wait_for_jobs("the GPU ring's comm thread to queue every bucket");
  cudaCheck(cudaEventRecord(done_, stream_));
  cudaCheck(cudaStreamWaitEvent(compute_stream, done_, 0));
}

void RingAllreduceCuda::synchronize() {
  wait_for_jobs("the GPU ring's comm thread to queue every bucket");
  memory_->synchronize();
}

bool RingAllreduceCuda::idle() {
  if (comm_thread_->failed() || !comm_thread_->idle()) return false;
  return cudaStreamQuery(stream_) == cudaSuccess;
}

cudaEvent_t RingAllreduceCuda::mark(cudaStream_t stream) {
  cudaEvent_t e = events_.get();
  cudaCheck(cudaEventRecord(e, stream));
  return e;
}

void RingAllreduceCuda::run(const float* in, float* out, size_t count, int tag) {
  link_->set_operation(tag);
  float* staging = static_cast<float*>(reduce_staging_.get());
  if (doubles(count)) return doubling_allreduce_sum(in, out, count, *link_, *memory_, staging, wire());
  ring_allreduce_sum(in, out, count, *link_, *memory_, staging, wire());
}

void RingAllreduceCuda::allreduce_sum(const float* in, float* out, size_t count) {
  wait_for_jobs("the GPU ring's comm thread to go idle");
  run(in, out, count, /*tag=*/0);
  memory_->synchronize();
}

void RingAllreduceCuda::enqueue_allreduce_sum(const float* in, float* out, size_t count) {
  // An emulated link (--link) sleeps on the host in each exchange, whatever its inner link: refused too.
  if (!queues_whole())
    throw std::logic_error(name_ + ": the host waits inside each exchange; only the nccl link queues without waiting");
  wait_for_jobs("the GPU ring's comm thread to go idle");
  run(in, out, count, /*tag=*/0);
}

}  // namespace ddplab::cuda
