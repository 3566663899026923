#include "comm/ring_device.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>
#include <utility>

#include "comm/recursive_doubling.h"
#include "comm/wire.h"
#include "kernels/cpu/transformer_ops.h"

namespace ddplab {

void HostMemory::copy(void* dst, const void* src, size_t bytes) {
  if (bytes) std::memcpy(dst, src, bytes);
}

void HostMemory::add(float* out, const float* a, const float* b, size_t count) {
  cpu::residual_forward(out, a, b, static_cast<int64_t>(count));  // the same out = a + b
}

void HostMemory::encode(float16::Format f, uint16_t* dst, const float* src, size_t count) {
  wire::encode(f, dst, src, count);
}

void HostMemory::decode(float16::Format f, float* dst, const uint16_t* src, size_t count) {
  wire::decode(f, dst, src, count);
}

void HostMemory::add_encode(float16::Format f, uint16_t* io, const float* own, size_t count) {
  wire::add_encode(f, io, own, count);
}

namespace {

void check_fits(const RingLink& link, size_t send_bytes, size_t recv_bytes) {
  if (std::max(send_bytes, recv_bytes) > link.max_bytes())
    throw std::invalid_argument(std::string(link.name()) + " link: a message of " +
                                std::to_string(std::max(send_bytes, recv_bytes)) + " bytes exceeds its " +
                                std::to_string(link.max_bytes()) + "-byte buffer");
}

}  // namespace

PeerStagingLink::PeerStagingLink(RingMemory& memory, Transport& tokens, void* my_staging,
                                 std::vector<void*> peer_staging, size_t staging_bytes, int tag)
    : memory_(memory),
      tokens_(tokens),
      my_staging_(my_staging),
      peer_staging_(std::move(peer_staging)),
      staging_bytes_(staging_bytes),
      tag_(tag) {}

void PeerStagingLink::send_recv(int to, const void* send, size_t send_bytes, int from, void* recv, size_t recv_bytes) {
  check_fits(*this, send_bytes, recv_bytes);
  const int go_tag = 2 * tag_, there_tag = 2 * tag_ + 1;
  // A pair's sizes match (send_bytes here is to's recv_bytes), so both ends skip the same tokens. The go token
  // carries the size the receiver takes: ranks whose all-reduces disagree (another count, another order) fail here,
  // as a host link's receive of the wrong size does, rather than sum stale staging bytes.
  if (recv_bytes) {
    memory_.synchronize();  // the last copy out of my staging has run
    go_ = static_cast<int64_t>(recv_bytes);
    tokens_.send(from, &go_, sizeof(go_), go_tag);
  }
  if (send_bytes) {
    tokens_.recv(to, &incoming_, sizeof(incoming_), go_tag);
    if (incoming_ != static_cast<int64_t>(send_bytes))
      throw std::runtime_error("rank " + std::to_string(rank()) + ": " + name() + " link to rank " +
                               std::to_string(to) + " (tag " + std::to_string(tag_) + "): it takes " +
                               std::to_string(incoming_) + " bytes, this rank sends " + std::to_string(send_bytes));
    memory_.copy(peer_staging_.at(to), send, send_bytes);
    memory_.synchronize();  // the data is in to's memory before `to` is told so
    tokens_.send(to, &there_, sizeof(there_), there_tag);
  }
  if (recv_bytes) {
    tokens_.recv(from, &incoming_, sizeof(incoming_), there_tag);
    memory_.copy(recv, my_staging_, recv_bytes);
  }
  tokens_.wait_sends();  // the token buffers are reused by the next exchange
}

LinkEmulatedRingLink::LinkEmulatedRingLink(std::unique_ptr<RingLink> inner,
                                           std::unique_ptr<LinkEmulatedTransport> timing, int tag)
    : inner_(std::move(inner)), timing_(std::move(timing)), tag_(tag) {
  if (timing_->rank() != inner_->rank() || timing_->size() != inner_->size())
    throw std::invalid_argument("LinkEmulatedRingLink: the timing transport must join the link's ranks, in its order");
}

void LinkEmulatedRingLink::send_recv(int to, const void* send, size_t send_bytes, int from, void* recv,
                                     size_t recv_bytes) {
  if (send_bytes) timing_->send_as(to, nullptr, 0, send_bytes, tag_);
  inner_->send_recv(to, send, send_bytes, from, recv, recv_bytes);
  if (recv_bytes) timing_->recv(from, nullptr, 0, tag_);  // sleeps until the message's arrival on the emulated link
  timing_->wait_sends();
}

HostStagedLink::HostStagedLink(RingMemory& memory, Transport& transport, void* host_send, void* host_recv,
                               size_t host_bytes, int tag)
    : memory_(memory),
      transport_(transport),
      host_send_(host_send),
      host_recv_(host_recv),
      host_bytes_(host_bytes),
      tag_(tag) {}

void HostStagedLink::send_recv(int to, const void* send, size_t send_bytes, int from, void* recv, size_t recv_bytes) {
  check_fits(*this, send_bytes, recv_bytes);
  memory_.copy(host_send_, send, send_bytes);
  // One wait covers the copy just queued and the last exchange's copy out of host_recv_, which is about to be
  // overwritten.
  memory_.synchronize();
  if (send_bytes) transport_.send(to, host_send_, send_bytes, tag_);
  if (recv_bytes) transport_.recv(from, host_recv_, recv_bytes, tag_);
  transport_.wait_sends();
  memory_.copy(recv, host_recv_, recv_bytes);
}

void LinkRingPrimitives::exchange_into(float* dst, size_t count) {
  link_.exchange(outgoing_.data, outgoing_.count * sizeof(float), dst, count * sizeof(float));
}

void LinkRingPrimitives::recv_reduce_send(RingChunk c) {
  exchange_into(staging_, c.count);
  memory_.add(out_ + c.offset, in_ + c.offset, staging_, c.count);
  outgoing_ = {out_ + c.offset, c.count};
}

void LinkRingPrimitives::recv_copy_send(RingChunk c) {
  exchange_into(out_ + c.offset, c.count);
  outgoing_ = {out_ + c.offset, c.count};
}

void LinkRingPrimitives::recv(RingChunk c) {
  exchange_into(out_ + c.offset, c.count);
  outgoing_ = {};
}

uint16_t* WireRingPrimitives::exchange(size_t count) {
  uint16_t* incoming = wire_[1 - outgoing_];
  link_.exchange(wire_[outgoing_], outgoing_count_ * sizeof(uint16_t), incoming, count * sizeof(uint16_t));
  outgoing_ = 1 - outgoing_;  // what came in goes out next (reduced, or as it is)
  return incoming;
}

void WireRingPrimitives::send(RingChunk c) {
  memory_.encode(format_, wire_[outgoing_], in_ + c.offset, c.count);
  outgoing_count_ = c.count;
}

void WireRingPrimitives::recv_reduce_send(RingChunk c) {
  memory_.add_encode(format_, exchange(c.count), in_ + c.offset, c.count);
  outgoing_count_ = c.count;
}

void WireRingPrimitives::recv_reduce_copy_send(RingChunk c) {
  uint16_t* sum = exchange(c.count);
  memory_.add_encode(format_, sum, in_ + c.offset, c.count);
  memory_.decode(format_, out_ + c.offset, sum, c.count);  // the owner keeps the rounded sum the others receive
  outgoing_count_ = c.count;
}

void WireRingPrimitives::recv_copy_send(RingChunk c) {
  memory_.decode(format_, out_ + c.offset, exchange(c.count), c.count);
  outgoing_count_ = c.count;
}

void WireRingPrimitives::recv(RingChunk c) {
  recv_copy_send(c);
  outgoing_count_ = 0;  // the last step: nothing goes on
}

size_t device_ring_max_chunk(const RingLink& link) { return link.max_bytes() / sizeof(float); }

namespace {

// Recursive doubling's steps on one round of the data, `sum` (out), on the device: the host's Exchanger
// (comm/recursive_doubling.cpp) as enqueued work. On a 16-bit wire `sum` holds values the wire represents exactly
// (own() rounds them), so what a rank adds is what its partner receives.
class DoublingRound {
 public:
  DoublingRound(RingLink& link, RingMemory& memory, float* staging, const DeviceRingWire* wire, float* sum, size_t n)
      : link_(link), memory_(memory), staging_(staging), wire_(wire), sum_(sum), n_(n) {}
  // sum = this rank's operand (rounded to the wire).
  void own(const float* mine) {
    if (!wire_) {
      if (mine != sum_) memory_.copy(sum_, mine, n_ * sizeof(float));
      return;
    }
    memory_.encode(wire_->format, outgoing(), mine, n_);
    memory_.decode(wire_->format, sum_, outgoing(), n_);
  }
  // sum = sum + partner's sum (rounded to the wire): the two partners add the same two operands.
  void exchange_add(int partner) { send_recv_add(partner, partner); }
  // The fold in and out: send hands this rank's sum to `to`; recv_add adds from's sum to this rank's.
  void send(int to) { send_recv_add(to, -1); }
  void recv_add(int from) { send_recv_add(-1, from); }
  // sum = from's sum.
  void recv_copy(int from) {
    if (!wire_) return link_.send_recv(-1, nullptr, 0, from, sum_, n_ * sizeof(float));
    link_.send_recv(-1, nullptr, 0, from, incoming(), n_ * sizeof(uint16_t));
    memory_.decode(wire_->format, sum_, incoming(), n_);
  }

 private:
  void send_recv_add(int to, int from) {
    const size_t sent = to >= 0 ? n_ : 0, received = from >= 0 ? n_ : 0;
    if (!wire_) {
      link_.send_recv(to, sum_, sent * sizeof(float), from, staging_, received * sizeof(float));
      if (received) memory_.add(sum_, sum_, staging_, n_);
      return;
    }
    if (sent) memory_.encode(wire_->format, outgoing(), sum_, n_);  // exact: sum is already rounded
    link_.send_recv(to, outgoing(), sent * sizeof(uint16_t), from, incoming(), received * sizeof(uint16_t));
    if (!received) return;
    memory_.add_encode(wire_->format, incoming(), sum_, n_);  // to16(sum + to32(incoming)), rounded once
    memory_.decode(wire_->format, sum_, incoming(), n_);
  }
  uint16_t* outgoing() const { return wire_->buffers[0]; }
  uint16_t* incoming() const { return wire_->buffers[1]; }

  RingLink& link_;
  RingMemory& memory_;
  float* staging_;
  const DeviceRingWire* wire_;
  float* sum_;
  size_t n_;
};

// Either algorithm's start: with one rank or nothing to sum (every rank has the same count, so all skip together)
// out = in and 0; else the largest chunk the link moves, in floats.
size_t exchanged_chunk(const float* in, float* out, size_t count, const RingLink& link, RingMemory& memory) {
  if (link.size() == 1 || count == 0) {
    if (in != out) memory.copy(out, in, count * sizeof(float));
    return 0;
  }
  const size_t max_chunk = device_ring_max_chunk(link);
  if (max_chunk == 0) throw std::invalid_argument(std::string(link.name()) + " link: buffer smaller than one float");
  return max_chunk;
}

}  // namespace

void ring_allreduce_sum(const float* in, float* out, size_t count, RingLink& link, RingMemory& memory, float* staging,
                        const DeviceRingWire* wire) {
  const int n = link.size();
  const size_t max_chunk = exchanged_chunk(in, out, count, link, memory);
  if (max_chunk == 0) return;
  const size_t round = std::min(count, max_chunk * n);
  if (wire) {
    WireRingPrimitives prims(link, memory, wire->format, in, out, wire->buffers);
    return run_ring_schedule(prims, count, round, n, link.rank());
  }
  LinkRingPrimitives prims(link, memory, in, out, staging);
  run_ring_schedule(prims, count, round, n, link.rank());
}

void doubling_allreduce_sum(const float* in, float* out, size_t count, RingLink& link, RingMemory& memory,
                            float* staging, const DeviceRingWire* wire) {
  const int n = link.size();
  const size_t max_chunk = exchanged_chunk(in, out, count, link, memory);
  if (max_chunk == 0) return;
  for (size_t begin = 0; begin < count; begin += max_chunk) {
    DoublingRound round(link, memory, staging, wire, out + begin, std::min(max_chunk, count - begin));
    round.own(in + begin);
    run_doubling_schedule(round, n, link.rank());
  }
}

}  // namespace ddplab
