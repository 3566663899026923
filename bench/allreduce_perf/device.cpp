#include "bench/allreduce_perf/device.h"

#include <cuda_runtime_api.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "comm/nccl_allreduce.h"
#include "kernels/cuda/check.cuh"
#include "kernels/cuda/device.h"

namespace ddplab::perf {
namespace {

// -G: `iterations` calls (-n) captured into one CUDA graph on the collective's stream, launched as one, each call at
// its call_offset in the buffers as the harness places plain calls. One graph is kept, for the last (in, out,
// count): a size's timed calls reuse it, the next one captures its own.
class GraphedCollective {
 public:
  GraphedCollective(DeviceCollective d, int iterations, size_t calls_span)
      : d_(std::move(d)), iterations_(iterations), calls_span_(calls_span) {}
  ~GraphedCollective() { release(); }
  GraphedCollective(const GraphedCollective&) = delete;
  GraphedCollective& operator=(const GraphedCollective&) = delete;

  void launch(const float* in, float* out, size_t count) {
    if (!exec_ || in != in_ || out != out_ || count != count_) capture(in, out, count);
    cudaCheck(cudaGraphLaunch(exec_, d_.stream));
  }
  void run(const float* in, float* out, size_t count) {
    launch(in, out, count);
    d_.wait();
  }
  void wait() { d_.wait(); }

 private:
  void capture(const float* in, float* out, size_t count) {
    release();
    d_.wait();  // nothing of an earlier call may land in the capture
    // Thread-local: a CUDA call of another thread (a comm thread's) neither joins the capture nor invalidates it.
    cudaCheck(cudaStreamBeginCapture(d_.stream, cudaStreamCaptureModeThreadLocal));
    cudaGraph_t graph = nullptr;
    try {
      for (int i = 0; i < iterations_; ++i) {
        const size_t at = call_offset(static_cast<size_t>(i), count, calls_span_);
        d_.enqueue(in + at, out + at, count);
      }
    } catch (...) {
      cudaStreamEndCapture(d_.stream, &graph);  // leave the stream usable for the error's unwinding
      if (graph) cudaGraphDestroy(graph);
      throw;
    }
    cudaCheck(cudaStreamEndCapture(d_.stream, &graph));
    const cudaError_t instantiated = cudaGraphInstantiate(&exec_, graph, 0);
    cudaGraphDestroy(graph);
    cudaCheck(instantiated);
    in_ = in, out_ = out, count_ = count;
  }
  void release() {
    if (exec_) cudaGraphExecDestroy(exec_);
    exec_ = nullptr;
  }

  DeviceCollective d_;
  int iterations_;
  size_t calls_span_;
  cudaGraphExec_t exec_ = nullptr;
  const float* in_ = nullptr;
  float* out_ = nullptr;
  size_t count_ = 0;
};

// nccl-tests' -G N: the -n timed calls captured once into a graph, launched N times (the warm-up launches it too).
Impl graph_impl(const ImplContext& c, const DeviceCollective& d) {
  auto timed = std::make_shared<GraphedCollective>(d, c.options.iters, c.options.calls_span());
  // The check: one captured collective, at the buffers' start, as the rows' calls.
  auto once = std::make_shared<GraphedCollective>(d, 1, 0);
  Impl impl;
  impl.label = c.name + "-graph";
  impl.run = [timed](const float* in, float* out, size_t count) { timed->run(in, out, count); };
  impl.run_once = [once](const float* in, float* out, size_t count) { once->run(in, out, count); };
  impl.enqueue = [timed](const float* in, float* out, size_t count) { timed->launch(in, out, count); };
  impl.wait = [timed] { timed->wait(); };
  impl.calls_per_run = c.options.iters;
  impl.places_calls = true;
  impl.timed_runs = c.options.cuda_graph;
  impl.device_in = d.in;
  impl.device_out = d.out;
  impl.owner = std::make_shared<std::pair<decltype(timed), decltype(once)>>(timed, once);  // each holds d.owner
  return impl;
}

}  // namespace

std::string device_problem() { return cuda::NcclAllreduce::availability(); }

std::string device_bus_id() { return cuda::query_cuda().bus_id; }

std::vector<Impl> device_impls(const ImplContext& c, DeviceCollective d) {
  if (!d.run)
    d.run = [enqueue = d.enqueue, wait = d.wait](const float* in, float* out, size_t count) {
      enqueue(in, out, count);
      wait();
    };
  Impl plain;
  plain.label = c.name;
  plain.run = d.run;
  plain.enqueue = d.enqueue;
  plain.wait = d.wait;
  plain.device_in = d.in;
  plain.device_out = d.out;
  plain.owner = d.owner;
  if (c.options.cuda_graph == 0) return {plain};
  return {plain, graph_impl(c, d)};
}

void copy_to_device(float* device, const float* host, size_t count) {
  cudaCheck(cudaMemcpy(device, host, count * sizeof(float), cudaMemcpyHostToDevice));
  // From pageable memory cudaMemcpy may return before its DMA lands, and it runs on the legacy stream, which the
  // comm streams (non-blocking) do not wait for: without this, an all-reduce read stale inputs (#wrong on an H200).
  cudaCheck(cudaDeviceSynchronize());
}

void copy_to_host(float* host, const float* device, size_t count) {
  cudaCheck(cudaMemcpy(host, device, count * sizeof(float), cudaMemcpyDeviceToHost));
}

}  // namespace ddplab::perf
