#include "comm/ring_device.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>

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
  for (size_t i = 0; i < count; ++i) io[i] = float16::from_f32(f, own[i] + float16::to_f32(f, io[i]));
}

namespace {

void check_fits(const RingLink& link, size_t send_bytes, size_t recv_bytes) {
  if (std::max(send_bytes, recv_bytes) > link.max_bytes())
    throw std::invalid_argument(std::string(link.name()) + " link: a message of " +
                                std::to_string(std::max(send_bytes, recv_bytes)) + " bytes exceeds its " +
                                std::to_string(link.max_bytes()) + "-byte buffer");
}

}  // namespace

PeerStagingLink::PeerStagingLink(RingMemory& memory, Transport& tokens, void* my_staging, void* next_staging,
                                 size_t staging_bytes, int tag)
    : memory_(memory),
      tokens_(tokens),
      my_staging_(my_staging),
      next_staging_(next_staging),
      staging_bytes_(staging_bytes),
      tag_(tag) {}

void PeerStagingLink::exchange(const void* send, size_t send_bytes, void* recv, size_t recv_bytes) {
  check_fits(*this, send_bytes, recv_bytes);
  const int n = size(), next = (rank() + 1) % n, prev = (rank() - 1 + n) % n;
  const int go_tag = 2 * tag_, there_tag = 2 * tag_ + 1;
  // A pair's sizes match (send_bytes here is next's recv_bytes), so both ends skip the same tokens.
  if (recv_bytes) {
    memory_.synchronize();  // the last copy out of my staging has run
    tokens_.send(prev, &go_, sizeof(go_), go_tag);
  }
  if (send_bytes) {
    tokens_.recv(next, &incoming_, sizeof(incoming_), go_tag);
    memory_.copy(next_staging_, send, send_bytes);
    memory_.synchronize();  // the data is in next's memory before next is told so
    tokens_.send(next, &there_, sizeof(there_), there_tag);
  }
  if (recv_bytes) {
    tokens_.recv(prev, &incoming_, sizeof(incoming_), there_tag);
    memory_.copy(recv, my_staging_, recv_bytes);
  }
  tokens_.wait_sends();  // the token buffers are reused by the next exchange
}

HostStagedLink::HostStagedLink(RingMemory& memory, Transport& transport, void* host_send, void* host_recv,
                               size_t host_bytes, int tag)
    : memory_(memory),
      transport_(transport),
      host_send_(host_send),
      host_recv_(host_recv),
      host_bytes_(host_bytes),
      tag_(tag) {}

void HostStagedLink::exchange(const void* send, size_t send_bytes, void* recv, size_t recv_bytes) {
  check_fits(*this, send_bytes, recv_bytes);
  const int n = size(), next = (rank() + 1) % n, prev = (rank() - 1 + n) % n;
  memory_.copy(host_send_, send, send_bytes);
  // One wait covers the copy just queued and the last exchange's copy out of host_recv_, which is about to be
  // overwritten.
  memory_.synchronize();
  if (send_bytes) transport_.send(next, host_send_, send_bytes, tag_);
  if (recv_bytes) transport_.recv(prev, host_recv_, recv_bytes, tag_);
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

// Two ranks: next and prev are the same peer, so each round of up to max_chunk elements is one exchange of the whole
// round, and each rank adds the peer's operand to its own: a + b on one, b + a on the other, the same bits (IEEE
// addition commutes). This is recursive doubling at p = 2 (comm/recursive_doubling.h), its arithmetic too: on a
// 16-bit wire both operands are rounded to it before they are added, and the sum after.
void pair_allreduce_sum(const float* in, float* out, size_t count, RingLink& link, RingMemory& memory, float* staging,
                        const DeviceRingWire* wire, size_t max_chunk) {
  for (size_t begin = 0; begin < count; begin += max_chunk) {
    const size_t n = std::min(max_chunk, count - begin);
    const float* mine = in + begin;
    float* sum = out + begin;
    if (!wire) {
      link.exchange(mine, n * sizeof(float), staging, n * sizeof(float));
      memory.add(sum, mine, staging, n);
      continue;
    }
    uint16_t *outgoing = wire->buffers[0], *incoming = wire->buffers[1];
    memory.encode(wire->format, outgoing, mine, n);
    memory.decode(wire->format, sum, outgoing, n);  // my operand as the peer receives it
    link.exchange(outgoing, n * sizeof(uint16_t), incoming, n * sizeof(uint16_t));
    memory.add_encode(wire->format, incoming, sum, n);
    memory.decode(wire->format, sum, incoming, n);
  }
}

}  // namespace

void ring_allreduce_sum(const float* in, float* out, size_t count, RingLink& link, RingMemory& memory, float* staging,
                        const DeviceRingWire* wire) {
  const int n = link.size();
  if (n == 1 || count == 0) {  // every rank has the same count, so all skip together
    if (in != out) memory.copy(out, in, count * sizeof(float));
    return;
  }
  const size_t max_chunk = device_ring_max_chunk(link);
  if (max_chunk == 0) throw std::invalid_argument(std::string(link.name()) + " link: buffer smaller than one float");
  if (n == 2) return pair_allreduce_sum(in, out, count, link, memory, staging, wire, max_chunk);
  const size_t round = std::min(count, max_chunk * n);
  if (wire) {
    WireRingPrimitives prims(link, memory, wire->format, in, out, wire->buffers);
    return run_ring_schedule(prims, count, round, n, link.rank());
  }
  LinkRingPrimitives prims(link, memory, in, out, staging);
  run_ring_schedule(prims, count, round, n, link.rank());
}

}  // namespace ddplab
