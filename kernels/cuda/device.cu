#include <cublasLt.h>
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstdio>
#include <string>

#include "kernels/cuda/device.h"

namespace ddplab::cuda {

CudaInfo query_cuda() noexcept {
  CudaInfo info;
  // Versions first: none of these needs a device, and they prove the libraries are linked for real.
  cudaRuntimeGetVersion(&info.runtime_version);
  cudaDriverGetVersion(&info.driver_version);
  info.cublas_version = static_cast<int>(cublasLtGetVersion());
  if (ncclGetVersion(&info.nccl_version) != ncclSuccess) info.nccl_version = 0;

  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    cudaGetLastError();  // clear it so a later, unrelated check does not report this error again
    info.reason = device_count_error(err);
    return info;
  }
  info.device_count = count;
  if (count == 0) {
    info.reason = "cudaGetDeviceCount found 0 devices";
    return info;
  }
  int dev = 0;
  cudaDeviceProp prop{};
  if ((err = cudaGetDevice(&dev)) != cudaSuccess || (err = cudaGetDeviceProperties(&prop, dev)) != cudaSuccess) {
    cudaGetLastError();
    info.reason = cudaGetErrorString(err);
    return info;
  }
  info.available = true;
  info.name = prop.name;
  info.cc_major = prop.major;
  info.cc_minor = prop.minor;
  info.memory_bytes = prop.totalGlobalMem;
  info.bus_id = pci_bus_id(dev);
  return info;
}

std::string pci_bus_id(int device) noexcept {
  char id[32] = {};  // cudaDeviceGetPCIBusId wants >= 13; NCCL uses 64-bit domains
  if (cudaDeviceGetPCIBusId(id, sizeof id, device) == cudaSuccess) return id;
  cudaGetLastError();
  return "";
}

std::string process_sharing_refused(int device) noexcept {
  int mode = cudaComputeModeDefault;
  if (cudaDeviceGetAttribute(&mode, cudaDevAttrComputeMode, device) != cudaSuccess) {
    cudaGetLastError();
    return "";
  }
  const std::string gpu = "GPU " + std::to_string(device) + " is in ";
  if (mode == cudaComputeModeExclusiveProcess) return gpu + "Exclusive_Process compute mode (one process at a time)";
  if (mode == cudaComputeModeProhibited) return gpu + "Prohibited compute mode (no process may use it)";
  return "";
}

std::string device_count_error(int err) noexcept {
  int driver = 0;
  cudaDriverGetVersion(&driver);
  if (err == cudaErrorInsufficientDriver && driver == 0) return "no NVIDIA driver on this machine";
  return cudaGetErrorString(static_cast<cudaError_t>(err));
}

std::string describe(const CudaInfo& info) {
  char buf[512];
  const auto ver3 = [](int v) {
    return std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100);
  };
  const auto cuda_ver = [](int v) { return std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10); };
  std::string head;
  if (info.available) {
    std::snprintf(buf, sizeof(buf), "%s (sm_%d%d, %.1f GiB), %d device(s)", info.name.c_str(), info.cc_major,
                  info.cc_minor, info.memory_bytes / double(1 << 30), info.device_count);
    head = buf;
  } else {
    head = "no CUDA device (" + info.reason + "; the CPU runs are unaffected)";
  }
  return head + ", runtime " + cuda_ver(info.runtime_version) + ", driver " +
         (info.driver_version > 0 ? cuda_ver(info.driver_version) : std::string("none")) + ", cuBLAS " +
         ver3(info.cublas_version) + ", NCCL " + ver3(info.nccl_version);
}

}  // namespace ddplab::cuda
