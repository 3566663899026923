// What CUDA sees on this process: device, compute capability, memory, and the versions of the runtime, driver,
// cuBLAS(Lt) and NCCL actually linked. Plain C++ (no CUDA types) so the launcher can print it and store it in the
// run metadata without nvcc.
#pragma once
#include <cstddef>
#include <string>

namespace ddplab::cuda {

struct CudaInfo {
  bool available = false;  // a device is usable; when false, `reason` says why and the device fields are empty
  std::string reason;      // the CUDA error string that made the device unusable; empty when available
  int device_count = 0;
  std::string name;  // of the current device (cudaGetDevice), which the launcher picks per local rank
  std::string bus_id;  // the current device's PCI bus id (cudaDeviceGetPCIBusId): ranks of one host with the same id
                       // share one GPU
  int cc_major = 0, cc_minor = 0;
  size_t memory_bytes = 0;  // total global memory
  int runtime_version = 0;  // CUDART_VERSION style: 1000*major + 10*minor, e.g. 13000
  int driver_version = 0;   // same encoding; 0 when no driver is installed
  int cublas_version = 0;   // cublasLtGetVersion(): 10000*major + 100*minor + patch, e.g. 130100
  int nccl_version = 0;     // ncclGetVersion(): 10000*major + 100*minor + patch, e.g. 22809
};

// Never throws; the library versions are filled in even when no device is available.
CudaInfo query_cuda() noexcept;

// Why cudaGetDeviceCount failed, in a person's words: without a driver the runtime blames the driver's version, which
// reads as a broken install on a host that simply has no GPU.
std::string device_count_error(int err) noexcept;

// `device`'s PCI bus id, e.g. "00000000:1B:00.0", without creating a context; "" if CUDA cannot say. Two processes
// with the same id use the same GPU, whatever CUDA_VISIBLE_DEVICES numbers it.
std::string pci_bus_id(int device) noexcept;

// "" when several processes may use `device` at once (the Default compute mode), else why not, e.g. "GPU 0 is in
// Exclusive_Process compute mode (one process at a time)": the second process's context creation would fail with
// "all CUDA-capable devices are busy or unavailable". Reads the mode without creating a context; "" if it cannot.
std::string process_sharing_refused(int device) noexcept;

// One line for logs, e.g. "NVIDIA H100 80GB HBM3 (sm_90, 79.1 GiB), 1 device(s), runtime 13.0, driver 13.0,
// cuBLAS 13.1.0, NCCL 2.28.9" or "no CUDA device (<reason>), runtime 13.0, ...".
std::string describe(const CudaInfo& info);

}  // namespace ddplab::cuda
