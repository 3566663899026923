// The ring all-reduce on buffers that live where the host cannot simply read them (GPU memory): the same schedule as
// the host ring (run_ring_schedule in comm/ring_allreduce.h), driven by primitives that only ENQUEUE work — a copy,
// an add, one exchange with the neighbours per step — and never touch the data themselves. Beside it, recursive
// doubling on the same links (doubling_allreduce_sum): fewer exchanges, for where an exchange costs a fixed time.
//
// Three interfaces keep the ring, the transports and the memory apart:
//   RingMemory  enqueues copies and adds on the memory's own queue (a CUDA stream; on the host, runs them at once)
//               and waits for them;
//   RingLink    one ring step: send a buffer to next, receive prev's into a buffer, ordered on that queue. Three
//               links: NCCL send/recv, CUDA IPC into the neighbour's staging buffer (ranks may share one GPU), and
//               the host-staged fallback (device -> pinned host -> MPI -> device);
//   LinkRingPrimitives  the five ring primitives over one RingLink and one RingMemory.
// Everything here is plain C++ and is tested in CI on host memory (HostMemory, and the IPC link's protocol over an
// MPI shared-memory window, tests/mpi/test_ring_device.cpp); comm/ring_cuda.h supplies the CUDA memory and links.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "comm/link_emulation.h"
#include "comm/ring_allreduce.h"
#include "comm/transport.h"
#include "kernels/float16.h"

namespace ddplab {

class RingMemory {
 public:
  virtual ~RingMemory() = default;
  // dst = src, bytes long; the ranges do not overlap. Enqueued after everything enqueued before.
  virtual void copy(void* dst, const void* src, size_t bytes) = 0;
  // out[i] = a[i] + b[i] for count floats; out may alias a. Enqueued.
  virtual void add(float* out, const float* a, const float* b, size_t count) = 0;
  // The 16-bit wire's conversions, with kernels/float16.h's rounding, enqueued:
  //   encode      dst[i] = to16(src[i])
  //   decode      dst[i] = to32(src[i])
  //   add_encode  io[i] = to16(own[i] + to32(io[i]))   (a reduce-scatter hop: the sum in fp32, rounded once)
  virtual void encode(float16::Format f, uint16_t* dst, const float* src, size_t count) = 0;
  virtual void decode(float16::Format f, float* dst, const uint16_t* src, size_t count) = 0;
  virtual void add_encode(float16::Format f, uint16_t* io, const float* own, size_t count) = 0;
  // The host waits until everything enqueued so far has run.
  virtual void synchronize() = 0;
};

// Host memory: every call runs at once, synchronize() has nothing to wait for.
class HostMemory final : public RingMemory {
 public:
  void copy(void* dst, const void* src, size_t bytes) override;
  void add(float* out, const float* a, const float* b, size_t count) override;
  void encode(float16::Format f, uint16_t* dst, const float* src, size_t count) override;
  void decode(float16::Format f, float* dst, const uint16_t* src, size_t count) override;
  void add_encode(float16::Format f, uint16_t* io, const float* own, size_t count) override;
  void synchronize() override {}
};

// One exchange between ranks: a ring step, or a recursive-doubling step with a partner. Every rank calls send_recv
// the same number of times; call k of a rank sends to `to` what call k of `to` receives from it, so the byte counts
// of a pair always match.
class RingLink {
 public:
  virtual ~RingLink() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // The largest message (bytes) an exchange accepts; the ring sizes its rounds to fit.
  virtual size_t max_bytes() const = 0;
  // Sends send[0, send_bytes) to rank `to` and receives the message of rank `from`, recv_bytes long, into recv, in the
  // order of the memory's queue: work enqueued before may still be writing `send` (the link waits for it), work
  // enqueued after sees `recv` filled. `send` must not change until work enqueued after this call runs. Either size
  // may be 0, and its rank is then not used: a chunk of an array shorter than the ring, a rank that only sends.
  virtual void send_recv(int to, const void* send, size_t send_bytes, int from, void* recv, size_t recv_bytes) = 0;
  // A ring step: to next = (rank+1) % size, from prev.
  void exchange(const void* send, size_t send_bytes, void* recv, size_t recv_bytes) {
    send_recv((rank() + 1) % size(), send, send_bytes, (rank() + size() - 1) % size(), recv, recv_bytes);
  }
  virtual const char* name() const = 0;
  // The operation (the reducer's bucket) the exchanges that follow belong to. A link whose messages go through a
  // Transport tags them with it, so that ranks running buckets in different orders get a TagMismatch, not another
  // bucket's sums, as on the host ring; NCCL's p2p carries no tag.
  virtual void set_operation(int tag) { (void)tag; }
  // Whether send_recv only queues its work on the memory's stream, the host waiting for none of it (NCCL's p2p), so
  // that an all-reduce over the link can be queued as a whole (a CUDA graph, a stream the caller waits on).
  virtual bool queues_without_host_waits() const { return false; }
};

// A link through a staging buffer in the RECEIVER's memory that the sender writes directly (CUDA IPC: each rank
// maps the other ranks' staging buffers into its own address space; tests: an MPI shared-memory window).
// Per exchange, with small MPI tokens between the pair (named watchdog waits, runtime/watchdog.h):
//   1. finish my queue (my previous read of my staging is done), then tell `from` "your write may start";
//   2. wait for `to`'s go, enqueue the copy send -> to's staging, finish it, tell `to` "it is there";
//   3. wait for `from`'s "it is there", enqueue the copy my staging -> recv.
// Step 1's token goes out before step 2 waits, so no rank waits for one that waits for it. Each rank's staging has
// one writer per exchange (its `from`). Each wait is short (one chunk's copy), and the host blocks inside the
// exchange: a caller that must not block runs the ring on a thread of its own (the CUDA reducer's comm thread).
// Staging costs one extra on-device copy per step (recv could be the staging itself; measure before trading that
// for a more intricate protocol).
class PeerStagingLink final : public RingLink {
 public:
  // my_staging: this rank's buffer that the others write into; peer_staging[k]: rank k's, mapped here (may be null
  // for a rank never sent to). All staging_bytes long. tokens: a Transport between the same ranks, in the same order
  // (its rank() and size() are the link's). tag: the exchange's token tags are 2*tag and 2*tag + 1, so a protocol
  // slip is a TagMismatch, not a wrong sum.
  PeerStagingLink(RingMemory& memory, Transport& tokens, void* my_staging, std::vector<void*> peer_staging,
                  size_t staging_bytes, int tag = 0);
  int rank() const override { return tokens_.rank(); }
  int size() const override { return tokens_.size(); }
  size_t max_bytes() const override { return staging_bytes_; }
  void send_recv(int to, const void* send, size_t send_bytes, int from, void* recv, size_t recv_bytes) override;
  const char* name() const override { return "peer staging"; }
  // Operations 16384 apart share their token tags (2 tag and 2 tag + 1 within MPI's guaranteed 32767).
  void set_operation(int tag) override { tag_ = tag % 16384; }

 private:
  RingMemory& memory_;
  Transport& tokens_;
  void* my_staging_;
  std::vector<void*> peer_staging_;
  size_t staging_bytes_;
  int tag_;
  // Token buffers (they must outlive the non-blocking sends): go_ the bytes my staging takes, there_ a signal.
  int64_t go_ = 0, there_ = 0, incoming_ = 0;
};

// The last fallback: send copied to a host buffer, the host buffers exchanged over MPI, the received one copied to
// recv. With HostMemory it is a plain MPI ring (tests); with CUDA memory, host_send/host_recv should be pinned.
class HostStagedLink final : public RingLink {
 public:
  HostStagedLink(RingMemory& memory, Transport& transport, void* host_send, void* host_recv, size_t host_bytes,
                 int tag = 0);
  int rank() const override { return transport_.rank(); }
  int size() const override { return transport_.size(); }
  size_t max_bytes() const override { return host_bytes_; }
  void send_recv(int to, const void* send, size_t send_bytes, int from, void* recv, size_t recv_bytes) override;
  const char* name() const override { return "host staged"; }
  void set_operation(int tag) override { tag_ = tag % 32768; }  // within MPI's guaranteed tags

 private:
  RingMemory& memory_;
  Transport& transport_;
  void* host_send_;
  void* host_recv_;
  size_t host_bytes_;
  int tag_;
};

// Link emulation (--link, comm/link_emulation.h) on a device link: the data moves over `inner` at its own speed,
// and each message's arrival time on the emulated link travels beside it over `timing` (a LinkEmulatedTransport
// between the same ranks, in the same order) as a message of no bytes timed as the data's. The exchange returns only
// once the incoming message has arrived, so nothing queued after it reads the data sooner. As on the host, the
// emulation only adds delay: a link faster than the real one runs at the real one's speed.
class LinkEmulatedRingLink final : public RingLink {
 public:
  LinkEmulatedRingLink(std::unique_ptr<RingLink> inner, std::unique_ptr<LinkEmulatedTransport> timing, int tag = 0);
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  size_t max_bytes() const override { return inner_->max_bytes(); }
  void send_recv(int to, const void* send, size_t send_bytes, int from, void* recv, size_t recv_bytes) override;
  const char* name() const override { return inner_->name(); }
  void set_operation(int tag) override { inner_->set_operation(tag); }

 private:
  std::unique_ptr<RingLink> inner_;
  std::unique_ptr<LinkEmulatedTransport> timing_;
  int tag_;
};

// The ring primitives of comm/ring_allreduce.h, each step one exchange: `send` only remembers what goes out next,
// and every receiving primitive exchanges it for prev's chunk. In queue order, so no step waits for the host:
//   recv_reduce_send       exchange into staging, then out[c] = in[c] + staging; out[c] goes out next;
//   recv_reduce_copy_send  the same (fp32 on the wire: the last reduction needs no rounding);
//   recv_copy_send / recv  exchange straight into out[c].
// A buffer is rewritten only after the step that sent it: the chunk sent at step s is never written at step s+1.
class LinkRingPrimitives {
 public:
  // staging: at least max_chunk floats in the link's memory.
  LinkRingPrimitives(RingLink& link, RingMemory& memory, const float* in, float* out, float* staging)
      : link_(link), memory_(memory), in_(in), out_(out), staging_(staging) {}
  void send(RingChunk c) { outgoing_ = {in_ + c.offset, c.count}; }
  void recv_reduce_send(RingChunk c);
  void recv_reduce_copy_send(RingChunk c) { recv_reduce_send(c); }
  void recv_copy_send(RingChunk c);
  void recv(RingChunk c);

 private:
  void exchange_into(float* dst, size_t count);
  struct Outgoing {
    const float* data = nullptr;
    size_t count = 0;
  };
  RingLink& link_;
  RingMemory& memory_;
  const float* in_;
  float* out_;
  float* staging_;
  Outgoing outgoing_;
};

// The same primitives with 16-bit words on the wire (the host ring's Wire16RingPrimitives, comm/ring_allreduce.h):
// the data stays fp32, each outgoing chunk is encoded into one of two wire buffers, and each incoming chunk lands in
// the other, where it is reduced in place (own + incoming, in fp32, rounded once) and becomes the next outgoing
// chunk. The owner of a finished chunk decodes its rounded sum, as every other rank decodes the same words, so all
// ranks end bitwise identical.
class WireRingPrimitives {
 public:
  // wire: two buffers of at least max_chunk 16-bit words in the link's memory.
  WireRingPrimitives(RingLink& link, RingMemory& memory, float16::Format format, const float* in, float* out,
                     uint16_t* const wire[2])
      : link_(link), memory_(memory), format_(format), in_(in), out_(out), wire_{wire[0], wire[1]} {}
  void send(RingChunk c);
  void recv_reduce_send(RingChunk c);
  void recv_reduce_copy_send(RingChunk c);
  void recv_copy_send(RingChunk c);
  void recv(RingChunk c);

 private:
  uint16_t* exchange(size_t count);  // sends the outgoing buffer, receives into the other one and returns it
  RingLink& link_;
  RingMemory& memory_;
  float16::Format format_;
  const float* in_;
  float* out_;
  uint16_t* wire_[2];
  int outgoing_ = 0;  // which wire buffer goes out next
  size_t outgoing_count_ = 0;
};

// A 16-bit wire for the device ring: its format and two buffers of device_ring_max_chunk(link) words each, in the
// memory the link moves.
struct DeviceRingWire {
  float16::Format format = float16::Format::kBf16;
  uint16_t* buffers[2] = {nullptr, nullptr};
};

// The largest chunk the device ring moves over `link`, in floats (what the staging passed to ring_allreduce_sum
// must hold): rounds of n chunks of at most this many.
size_t device_ring_max_chunk(const RingLink& link);

// out[i] = sum over the link's ranks of in[i] (out == in: in place), ENQUEUED on the memory's queue after the work
// before it; the host may block inside the link's exchanges (PeerStagingLink, HostStagedLink) but returns before the
// last copies have run: memory.synchronize() waits for the result. Every rank calls it with the same count; each
// element is summed in the host ring's order for the same chunking, then only copied, so every rank ends bitwise
// identical (and equal to ring_allreduce_sum with slice_elems = device_ring_max_chunk, slices_per_chunk = 1).
// staging: device_ring_max_chunk(link) floats in the memory the link moves. With `wire` the chunks travel as 16-bit
// words (the same chunking, half the bytes; staging goes unused) and the result equals the host ring's on that wire
// for the same chunking.
void ring_allreduce_sum(const float* in, float* out, size_t count, RingLink& link, RingMemory& memory, float* staging,
                        const DeviceRingWire* wire = nullptr);

// The same contract by recursive doubling (comm/recursive_doubling.h, MPICH's scheme, ranks beyond the power of two
// p folded in and out), in rounds of device_ring_max_chunk elements: each round log2 p exchanges of the whole round
// (+2 for a folded rank) where the ring takes 2(n-1) of 1/n of n chunks. Where an exchange costs a fixed time
// whatever it moves (ranks sharing a GPU take turns on it: comm/ring_cuda.h), that is 1 exchange instead of 2 at
// two ranks and 2 instead of 6 at four, for log2 p / (2(n-1)/n) times the bytes (the same at two ranks). The two
// partners of an exchange add the same two operands, so every rank ends bitwise identical and equal to
// recursive_doubling_allreduce_sum on the host, on either wire.
void doubling_allreduce_sum(const float* in, float* out, size_t count, RingLink& link, RingMemory& memory,
                            float* staging, const DeviceRingWire* wire = nullptr);

}  // namespace ddplab
