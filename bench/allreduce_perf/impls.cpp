// The table of allreduce_perf's implementations, and what they share: the Communicator's all-reduce as an Impl.
#include <mpi.h>

#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench/allreduce_perf/impl.h"
#include "comm/communicator.h"
#ifdef DDPLAB_HAVE_CUDA
#include "bench/allreduce_perf/device.h"
#define DDPLAB_GPU_MAKER(f) f
#else
#define DDPLAB_GPU_MAKER(f) nullptr
#endif

namespace ddplab::perf {
namespace {

constexpr const char* kOnHost = "it runs on the host; a CUDA graph captures device work (nccl, gpu-ring-nccl)";
constexpr const char* kBlocksHost =
    "its link makes the host wait at every ring step (MPI messages between the ranks), which a CUDA graph cannot "
    "capture (gpu-ring-nccl can)";

constexpr ImplSpec kImpls[] = {
    {"ring", "float", true, false, kOnHost, make_ring},
    {"ring-only", "float", true, false, kOnHost, make_ring_only},
    {"ring-bf16", "bfloat16", true, false, kOnHost, make_ring_bf16},
    {"ring-fp16", "half", true, false, kOnHost, make_ring_fp16},
    {"ring-sharded", "float", true, false, kOnHost, make_ring_sharded},
    {"mpi", "float", true, false, kOnHost, make_mpi},
    {"hier", "float", true, false, kOnHost, make_hier},
    {"mpi-raw", "float", false, false, kOnHost, make_mpi_raw},
    {"nccl", "float", false, true, nullptr, DDPLAB_GPU_MAKER(make_nccl)},
    {"gpu-ring-nccl", "float", true, true, nullptr, DDPLAB_GPU_MAKER(make_gpu_ring)},
    {"gpu-ring-ipc", "float", true, true, kBlocksHost, DDPLAB_GPU_MAKER(make_gpu_ring)},
    {"gpu-ring-host", "float", true, true, kBlocksHost, DDPLAB_GPU_MAKER(make_gpu_ring)},
};

}  // namespace

const ImplSpec& impl_spec(const std::string& name) {
  for (const ImplSpec& i : kImpls)
    if (name == i.name) return i;
  std::string known;
  for (const ImplSpec& i : kImpls) known += (known.empty() ? "" : ", ") + std::string(i.name);
  throw UsageError("--impls " + name + ": unknown implementation (" + known + ")");
}

std::vector<Impl> make_impls(const std::string& name, const Options& o, size_t max_count,
                             std::vector<std::string>& transports) {
  const ImplSpec& spec = impl_spec(name);
  if (!spec.make) throw std::logic_error("make_impls: " + name + " is not built");  // parse_options refused it
  std::vector<Impl> impls = spec.make(ImplContext{name, o, max_count, transports});
  for (Impl& impl : impls) {
    impl.wire_type = spec.wire_type;
    if (!impl.run_once) impl.run_once = impl.run;
    if (!queues_calls(spec, o)) {  // the spec decides, as parse_options did; the maker supplies the means
      impl.enqueue = nullptr;
      impl.wait = nullptr;
    } else if (!impl.enqueue || !impl.wait) {
      throw std::logic_error("make_impls: " + name + " queues its calls but its maker gave no enqueue and wait");
    }
  }
  return impls;
}

void Impl::load_in(const float* host, size_t count) const {
#ifdef DDPLAB_HAVE_CUDA
  if (device_in) copy_to_device(device_in, host, count);
#endif
  (void)host, (void)count;
}

void Impl::load_out(const float* host, size_t count) const {
#ifdef DDPLAB_HAVE_CUDA
  if (device_out) copy_to_device(device_out, host, count);
#endif
  (void)host, (void)count;
}

void Impl::fetch_result(float* host, bool in_place, size_t count) const {
#ifdef DDPLAB_HAVE_CUDA
  if (device_in) copy_to_host(host, in_place ? device_in : device_out, count);
#endif
  (void)host, (void)in_place, (void)count;
}

std::vector<Impl> communicator_impl(const ImplContext& c, const CommOptions& options) {
  std::shared_ptr<Communicator> comm;
  try {
    comm = std::make_shared<Communicator>(MPI_COMM_WORLD, options);
  } catch (const std::invalid_argument& e) {
    throw UsageError("--impls " + c.name + ": " + e.what());
  }
  c.transports.push_back(c.name + " over " + comm->transport_name());
  Impl impl;
  impl.label = c.name;
  impl.run = [comm, tag = 0](const float* in, float* out, size_t count) mutable {
    comm->allreduce_sum_into(in, out, count, tag);
    tag = (tag + 1) % 32768;  // a tag per call, as the Reducer's buckets: the order check runs too
  };
  impl.owner = comm;
  return {impl};
}

}  // namespace ddplab::perf
