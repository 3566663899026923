// libddplab_gpu_trace.so: every kernel, copy and memset a process runs on the GPU, with its start, end and stream,
// recorded by CUPTI's activity API and written at exit as the CSV bench/device/gpu_gaps.py reads (nsys's
// cuda_gpu_trace columns). The device machine has ncu but no nsys, and ncu times kernels one at a time: neither shows
// where a training step leaves the GPU idle. Loaded by the CUDA driver itself, no change to the program:
//
//   export DDPLAB_GPU_TRACE=trace.csv CUDA_INJECTION64_PATH=$PWD/build/bench/gpu/libddplab_gpu_trace.so
//   build/launcher/ddplab train --device cuda ... --profile-steps 20:24
//
// Under mpirun, hand both to the ranks alone (-x NAME=VALUE): a trace is one process's, written at its exit.
//
// When the program calls cudaProfilerStart / cudaProfilerStop (ddplab's --profile-steps, which calls them with the
// GPU idle), only what ran between the first start and the last stop is written.
#include <cupti.h>
#include <cxxabi.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace {

struct Activity {
  uint64_t start, end;  // ns, CUPTI's clock (cuptiGetTimestamp's)
  uint32_t stream;
  std::string name;
};

std::mutex g_mutex;
std::vector<Activity> g_activities;  // under g_mutex
std::atomic<uint64_t> g_window_start{0}, g_window_end{UINT64_MAX};
std::atomic<bool> g_windowed{false};
constexpr size_t kBufferBytes = size_t{8} << 20;

void report(const char* what, CUptiResult result) {
  const char* text = nullptr;
  cuptiGetResultString(result, &text);
  std::fprintf(stderr, "gpu_trace: %s: %s\n", what, text ? text : "unknown CUPTI error");
}

std::string demangled(const char* name) {
  if (name == nullptr) return "?";
  int status = 0;
  std::unique_ptr<char, decltype(&std::free)> plain(abi::__cxa_demangle(name, nullptr, nullptr, &status), &std::free);
  return status == 0 && plain ? std::string(plain.get()) : std::string(name);
}

std::string copy_name(uint8_t kind) {
  switch (kind) {
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOD:
      return "[CUDA memcpy Host-to-Device]";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOH:
      return "[CUDA memcpy Device-to-Host]";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOD:
      return "[CUDA memcpy Device-to-Device]";
    case CUPTI_ACTIVITY_MEMCPY_KIND_PTOP:
      return "[CUDA memcpy Peer-to-Peer]";
    default:
      return "[CUDA memcpy]";
  }
}

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = *buffer ? kBufferBytes : 0;
  *max_records = 0;  // as many as fit
}

void CUPTIAPI buffer_completed(CUcontext context, uint32_t stream, uint8_t* buffer, size_t, size_t valid_bytes) {
  std::vector<Activity> batch;
  CUpti_Activity* record = nullptr;
  while (cuptiActivityGetNextRecord(buffer, valid_bytes, &record) == CUPTI_SUCCESS) {
    switch (record->kind) {
      case CUPTI_ACTIVITY_KIND_KERNEL:
      case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
        const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
        batch.push_back({k->start, k->end, k->streamId, demangled(k->name)});
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMCPY: {
        const auto* m = reinterpret_cast<const CUpti_ActivityMemcpy6*>(record);
        batch.push_back({m->start, m->end, m->streamId, copy_name(m->copyKind)});
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMSET: {
        const auto* m = reinterpret_cast<const CUpti_ActivityMemset4*>(record);
        batch.push_back({m->start, m->end, m->streamId, "[CUDA memset]"});
        break;
      }
      default:
        break;
    }
  }
  size_t dropped = 0;
  cuptiActivityGetNumDroppedRecords(context, stream, &dropped);
  if (dropped > 0) std::fprintf(stderr, "gpu_trace: CUPTI dropped %zu records\n", dropped);
  std::free(buffer);
  const std::lock_guard<std::mutex> lock(g_mutex);
  g_activities.insert(g_activities.end(), batch.begin(), batch.end());
}

// cudaProfilerStart opens the window (the first one), cudaProfilerStop closes it (the last one), both on return.
void CUPTIAPI on_runtime_call(void*, CUpti_CallbackDomain, CUpti_CallbackId id, const void* data) {
  if (static_cast<const CUpti_CallbackData*>(data)->callbackSite != CUPTI_API_EXIT) return;
  uint64_t now = 0;
  cuptiGetTimestamp(&now);
  if (id == CUPTI_RUNTIME_TRACE_CBID_cudaProfilerStart_v4000) {
    if (!g_windowed.exchange(true)) g_window_start = now;
  } else if (id == CUPTI_RUNTIME_TRACE_CBID_cudaProfilerStop_v4000) {
    g_window_end = now;
  }
}

// Writes the CSV, quoting names (a demangled name has commas), sorted by start.
void write_trace() {
  const CUptiResult flushed = cuptiActivityFlushAll(1);
  if (flushed != CUPTI_SUCCESS) report("flushing the activity buffers", flushed);
  const char* path = std::getenv("DDPLAB_GPU_TRACE");
  std::FILE* f = std::fopen(path, "w");
  if (f == nullptr) {
    std::fprintf(stderr, "gpu_trace: cannot write %s\n", path);
    return;
  }
  const std::lock_guard<std::mutex> lock(g_mutex);
  std::sort(g_activities.begin(), g_activities.end(),
            [](const Activity& a, const Activity& b) { return a.start < b.start; });
  std::fprintf(f, "\"Start (ns)\",\"Duration (ns)\",\"Strm\",\"Name\"\n");
  size_t written = 0;
  for (const Activity& a : g_activities) {
    if (g_windowed && (a.start < g_window_start || a.end > g_window_end)) continue;
    std::string quoted;
    for (char c : a.name) quoted += c == '"' ? std::string("\"\"") : std::string(1, c);
    std::fprintf(f, "%llu,%llu,%u,\"%s\"\n", static_cast<unsigned long long>(a.start),
                 static_cast<unsigned long long>(a.end - a.start), a.stream, quoted.c_str());
    ++written;
  }
  std::fclose(f);
  std::fprintf(stderr, "gpu_trace: %zu of %zu activities written to %s%s\n", written, g_activities.size(), path,
               g_windowed ? " (between cudaProfilerStart and cudaProfilerStop)" : "");
}

}  // namespace

// The CUDA driver calls this once, at cuInit, in a process started with CUDA_INJECTION64_PATH naming this library.
extern "C" __attribute__((visibility("default"))) int InitializeInjection() {
  if (std::getenv("DDPLAB_GPU_TRACE") == nullptr) {
    std::fprintf(stderr, "gpu_trace: DDPLAB_GPU_TRACE (the CSV to write) is not set: not tracing\n");
    return 1;
  }
  CUptiResult r = cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed);
  for (CUpti_ActivityKind kind :
       {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMCPY, CUPTI_ACTIVITY_KIND_MEMSET})
    if (r == CUPTI_SUCCESS) r = cuptiActivityEnable(kind);
  CUpti_SubscriberHandle subscriber = nullptr;
  if (r == CUPTI_SUCCESS) r = cuptiSubscribe(&subscriber, on_runtime_call, nullptr);
  for (CUpti_CallbackId id :
       {CUPTI_RUNTIME_TRACE_CBID_cudaProfilerStart_v4000, CUPTI_RUNTIME_TRACE_CBID_cudaProfilerStop_v4000})
    if (r == CUPTI_SUCCESS) r = cuptiEnableCallback(1, subscriber, CUPTI_CB_DOMAIN_RUNTIME_API, id);
  if (r != CUPTI_SUCCESS) {
    report("setting up the activity trace", r);
    return 0;
  }
  std::atexit(write_trace);
  return 1;
}
