// Inputs and checks the all-reduce tests share: exactly-summable inputs, random ones, and bitwise comparisons
// within a rank and across ranks.
#pragma once
#include <mpi.h>

#include <cstdint>
#include <cstring>
#include <deque>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "comm/transport.h"

namespace ddplab {

inline uint32_t bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
}

// Small integers: every partial sum is exact in fp32, so any reduction order must give these bits.
inline float exact_input(int rank, size_t i) { return static_cast<float>((rank + 1) * static_cast<int>(i % 17 + 1)); }
inline float exact_sum(int n, size_t i) { return static_cast<float>(static_cast<int>(i % 17 + 1) * n * (n + 1) / 2); }

inline std::vector<float> exact_inputs(int rank, size_t count, float factor = 1.0f) {
  std::vector<float> v(count);
  for (size_t i = 0; i < count; ++i) v[i] = exact_input(rank, i) * factor;
  return v;
}

inline std::vector<float> random_inputs(int rank, size_t count) {
  std::mt19937 gen(1234u + 7919u * static_cast<unsigned>(rank) + static_cast<unsigned>(count));
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(count);
  for (float& x : v) x = dist(gen);
  return v;
}

// "" when got == want bit for bit, else "#wrong N, first at i: got G want W".
inline std::string bitwise_mismatch(const std::vector<float>& got, const std::vector<float>& want) {
  size_t wrong = 0, first = 0;
  for (size_t i = 0; i < got.size(); ++i)
    if (bits(got[i]) != bits(want[i]) && wrong++ == 0) first = i;
  if (wrong == 0) return "";
  std::ostringstream os;
  os.precision(9);
  os << "#wrong " << wrong << " of " << got.size() << ", first at " << first << ": got " << got[first] << " want "
     << want[first];
  return os.str();
}

// Elements whose bit pattern differs on some rank: the elementwise min and max over ranks must coincide.
inline size_t count_differing_across_ranks(const std::vector<float>& v) {
  std::vector<uint32_t> lo(v.size()), hi(v.size());
  for (size_t i = 0; i < v.size(); ++i) lo[i] = hi[i] = bits(v[i]);
  MPI_Allreduce(MPI_IN_PLACE, lo.data(), static_cast<int>(v.size()), MPI_UINT32_T, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(MPI_IN_PLACE, hi.data(), static_cast<int>(v.size()), MPI_UINT32_T, MPI_MAX, MPI_COMM_WORLD);
  size_t differing = 0;
  for (size_t i = 0; i < v.size(); ++i) differing += lo[i] != hi[i];
  return differing;
}

// Wraps a Transport and checks that the algorithm keeps its side of the contract, which MPI alone would not
// reveal (the ring's own data dependencies usually hide a missing wait): a buffer handed to send is unchanged
// when wait_sends retires it, and nothing is still in flight when the algorithm returns.
class ContractCheckingTransport final : public Transport {
 public:
  explicit ContractCheckingTransport(Transport& inner) : inner_(inner) {}
  explicit ContractCheckingTransport(std::unique_ptr<Transport> inner) : owned_(std::move(inner)), inner_(*owned_) {}
  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  void send(int peer, const void* buf, size_t bytes, int tag) override {
    in_flight_.push_back({buf, bytes, fnv1a(buf, bytes)});
    bytes_sent_ += bytes;
    inner_.send(peer, buf, bytes, tag);
  }
  void recv(int peer, void* buf, size_t bytes, int tag) override { inner_.recv(peer, buf, bytes, tag); }
  void recv_consume(int peer, size_t bytes, int tag, void* staging, const Consume& consume) override {
    inner_.recv_consume(peer, bytes, tag, staging, consume);
  }
  bool progress() override { return inner_.progress(); }
  void wait_sends(size_t keep_last) override {
    inner_.wait_sends(keep_last);
    while (in_flight_.size() > keep_last) {
      const InFlight& s = in_flight_.front();
      modified_ += fnv1a(s.buf, s.bytes) != s.hash;
      in_flight_.pop_front();
    }
  }
  size_t in_flight() const { return in_flight_.size(); }
  size_t modified() const { return modified_; }
  size_t bytes_sent() const { return bytes_sent_; }

 private:
  struct InFlight {
    const void* buf;
    size_t bytes;
    uint64_t hash;
  };
  static uint64_t fnv1a(const void* buf, size_t bytes) {
    uint64_t h = 14695981039346656037ull;
    for (size_t i = 0; i < bytes; ++i) h = (h ^ static_cast<const unsigned char*>(buf)[i]) * 1099511628211ull;
    return h;
  }
  std::unique_ptr<Transport> owned_;
  Transport& inner_;
  std::deque<InFlight> in_flight_;
  size_t modified_ = 0, bytes_sent_ = 0;
};

}  // namespace ddplab
