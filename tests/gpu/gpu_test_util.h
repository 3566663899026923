// Shared by the GPU tests: device query, host random data, device buffers with a poisoned guard tail, bf16 host
// conversion (the wire's), and tolerance checks.
//
// Every device buffer carries a guard tail of 0xFF bytes (a NaN for fp32 and bf16, -1 for int32) that must survive
// the kernel (no out-of-bounds writes), and buffers created without data are all poison (every output element
// must be written).
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "kernels/cuda/check.cuh"
#include "kernels/cuda/device.h"
#include "kernels/float16.h"

namespace ddplab::gpu_test {

inline const cuda::CudaInfo& cuda_info() {
  static const cuda::CudaInfo info = cuda::query_cuda();
  return info;
}

constexpr int64_t kGuard = 67;  // trailing elements that no kernel may touch

// Visible CUDA devices; 0 without a usable driver (the error is cleared, not left sticky).
inline int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

// Why `ranks` processes of this node, placed as choose_device places them (local rank % devices), cannot run here,
// "" if they can: where two of them share a GPU whose compute mode takes one process at a time (Exclusive_Process)
// the second one's context creation fails, so the several-ranks-on-one-GPU cases skip with this reason.
inline std::string gpu_sharing_refused(int ranks) {
  const int n = device_count();
  for (int d = 0; d < std::min(n, ranks - n); ++d)  // the devices that two or more ranks would share
    if (const std::string why = cuda::process_sharing_refused(d); !why.empty())
      return std::to_string(ranks) + " ranks would share " + std::to_string(n) + " GPU(s), and " + why;
  return "";
}

inline std::vector<float> random_vector(int64_t n, float lo, float hi, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// A bf16 from its 16 bits and back (through cuda_bf16.h's raw type: __nv_bfloat16 is not trivially copyable).
inline __nv_bfloat16 bf16_from_bits(uint16_t h) {
  __nv_bfloat16_raw raw;
  raw.x = h;
  return __nv_bfloat16(raw);
}
inline uint16_t bits_of(__nv_bfloat16 x) { return static_cast<__nv_bfloat16_raw>(x).x; }

// bf16 on the host through the wire's conversion (round to nearest even), the reference of convert.h.
inline std::vector<__nv_bfloat16> to_bf16(const std::vector<float>& x) {
  std::vector<__nv_bfloat16> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = bf16_from_bits(float16::f32_to_bf16(x[i]));
  return out;
}
inline std::vector<float> to_f32(const std::vector<__nv_bfloat16>& x) {
  std::vector<float> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = float16::bf16_to_f32(bits_of(x[i]));
  return out;
}
// x rounded to bf16 and back: the values a bf16 kernel actually sees.
inline std::vector<float> round_bf16(const std::vector<float>& x) { return to_f32(to_bf16(x)); }

// The values one element along (a leading 0), and back: device pointers + 1 take the kernels' one-element-a-thread
// path, which 16-byte-aligned buffers never run.
inline std::vector<float> shifted(const std::vector<float>& v) {
  std::vector<float> out(1, 0.0f);
  out.insert(out.end(), v.begin(), v.end());
  return out;
}
inline std::vector<float> unshifted(const std::vector<float>& v) { return std::vector<float>(v.begin() + 1, v.end()); }
// x as a kernel of element type T (float or bf16) holds it, and back to floats.
template <typename T>
std::vector<T> device_values(const std::vector<float>& x) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>)
    return to_bf16(x);
  else
    return x;
}
template <typename T>
std::vector<float> host_values(const std::vector<T>& x) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>)
    return to_f32(x);
  else
    return x;
}

// A device array of n elements of T plus the guard tail, all of it poison unless uploaded.
template <typename T>
class DeviceBuffer {
 public:
  DeviceBuffer(int64_t n, cudaStream_t stream) : n_(n), stream_(stream) {
    cudaCheck(cudaMalloc(&ptr_, bytes(n_ + kGuard)));
    cudaCheck(cudaMemsetAsync(ptr_, 0xFF, bytes(n_ + kGuard), stream_));
  }
  DeviceBuffer(const std::vector<T>& host, cudaStream_t stream)
      : DeviceBuffer(static_cast<int64_t>(host.size()), stream) {
    upload(host);
  }
  ~DeviceBuffer() { cudaFree(ptr_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  T* get() { return ptr_; }
  int64_t size() const { return n_; }

  void upload(const std::vector<T>& host) {
    cudaCheck(
        cudaMemcpyAsync(ptr_, host.data(), bytes(static_cast<int64_t>(host.size())), cudaMemcpyHostToDevice, stream_));
    cudaCheck(cudaStreamSynchronize(stream_));  // the caller may change `host` right away (the CPU reference)
  }

  // The n values; fails the current test if the guard tail was written.
  std::vector<T> download() const {
    std::vector<T> all(n_ + kGuard);
    cudaCheck(cudaMemcpyAsync(all.data(), ptr_, bytes(n_ + kGuard), cudaMemcpyDeviceToHost, stream_));
    cudaCheck(cudaStreamSynchronize(stream_));
    for (int64_t i = n_; i < n_ + kGuard; ++i) {
      unsigned char raw[sizeof(T)];
      std::memcpy(raw, &all[i], sizeof(T));
      for (unsigned char byte : raw)
        if (byte != 0xFF) {
          ADD_FAILURE() << "kernel wrote past the end: element " << i << " of " << n_;
          break;
        }
    }
    all.resize(n_);
    return all;
  }

 private:
  static size_t bytes(int64_t count) { return static_cast<size_t>(count) * sizeof(T); }
  int64_t n_;
  cudaStream_t stream_;
  T* ptr_ = nullptr;
};

using DeviceArray = DeviceBuffer<float>;

// |got - want| <= atol + rtol * |want| everywhere; NaN (an unwritten element) always fails.
inline ::testing::AssertionResult AllClose(const std::vector<float>& got, const std::vector<float>& want, double rtol,
                                           double atol) {
  if (got.size() != want.size()) return ::testing::AssertionFailure() << "size " << got.size() << " vs " << want.size();
  int64_t bad = 0, worst = -1;
  double worst_excess = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::fabs(static_cast<double>(got[i]) - want[i]);
    const double excess = err - (atol + rtol * std::fabs(want[i]));
    if (!(excess <= 0)) {  // written so that NaN counts as bad
      ++bad;
      if (worst < 0 || !(excess <= worst_excess)) {
        worst = static_cast<int64_t>(i);
        worst_excess = excess;
      }
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << bad << " of " << got.size() << " elements outside rtol " << rtol << " atol "
                                       << atol << "; worst at " << worst << ": got " << got[worst] << " want "
                                       << want[worst];
}

// Bit-for-bit equality (distinguishes -0 from 0 and NaN payloads).
inline ::testing::AssertionResult BitwiseEqual(const std::vector<float>& got, const std::vector<float>& want) {
  if (got.size() != want.size()) return ::testing::AssertionFailure() << "size " << got.size() << " vs " << want.size();
  if (got.empty() || std::memcmp(got.data(), want.data(), got.size() * sizeof(float)) == 0)
    return ::testing::AssertionSuccess();
  for (size_t i = 0; i < got.size(); ++i)
    if (std::memcmp(&got[i], &want[i], sizeof(float)) != 0)
      return ::testing::AssertionFailure() << "first difference at " << i << ": got " << got[i] << " want " << want[i];
  return ::testing::AssertionFailure();
}

// The all-reduce tests' inputs: small integers in [-8, 8], different on every rank, so every sum is exact in fp32
// whatever order an implementation adds in, and results compare bit for bit (after nccl-tests).
inline float allreduce_input(size_t i, int rank) {
  return static_cast<float>(static_cast<int>((i * 7 + rank * 3) % 17) - 8);
}
inline std::vector<float> allreduce_inputs(size_t n, int rank) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = allreduce_input(i, rank);
  return v;
}
// The sum over ranks first_rank .. first_rank + size - 1 of their inputs.
inline std::vector<float> allreduce_expected_sum(size_t n, int size, int first_rank = 0) {
  std::vector<float> want(n, 0.0f);
  for (int r = first_rank; r < first_rank + size; ++r)
    for (size_t i = 0; i < n; ++i) want[i] += allreduce_input(i, r);
  return want;
}

// Rows packed as `--batching pack` packs them: row b holds sequences of sequences[b]'s lengths back to back, each
// token's position counted from its sequence's start. Past their sum (the row's length) the row is padding, whose
// positions are `padding` (never read).
struct PackedRows {
  std::vector<int32_t> positions;  // [B, S]
  std::vector<int32_t> lengths;    // [B]
};
inline PackedRows pack_sequences(int S, const std::vector<std::vector<int>>& sequences, int32_t padding = 0) {
  const int B = static_cast<int>(sequences.size());
  PackedRows rows{std::vector<int32_t>(int64_t{B} * S, padding), std::vector<int32_t>(B, 0)};
  for (int b = 0; b < B; ++b) {
    int t = 0;
    for (int n : sequences[b]) {
      if (t + n > S)
        throw std::invalid_argument("pack_sequences: row " + std::to_string(b) +
                                    "'s sequences run past S = " + std::to_string(S));
      for (int p = 0; p < n; ++p) rows.positions[int64_t{b} * S + t++] = p;
    }
    rows.lengths[b] = t;
  }
  return rows;
}

// A non-blocking stream per test, skipped with the reason when no device is usable: the launchers must honour the
// stream they are given, not the legacy default one.
class DeviceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda_info().available) GTEST_SKIP() << "no CUDA device: " << cuda_info().reason;
    cudaCheck(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  }
  void TearDown() override {
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }
  cudaStream_t stream_ = nullptr;
};

}  // namespace ddplab::gpu_test
