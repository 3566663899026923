// The direct collectives ("two-shot", after the one-node all-reduces of TensorRT-LLM and vLLM), for ranks that all
// share one host: each rank works on the chunks the ring would have it own (ring_owned_chunks), reading and writing
// every rank's buffers where they lie in shared memory (RegisteredBuffers, comm/shm_segments.h):
//   kAllreduce      sums its chunks of every rank's `in`, in the ring's order, and stores the sums (x final_scale)
//                   into those chunks of every rank's `out` (in == out: in place);
//   kReduceScatter  the same sums, stored into its own `out` only (the other elements keep what they held);
//   kAllGather      copies its chunks of its own `in` into every other rank's `out` (in == out: data[i] = its
//                   owner's data[i]).
// The ring's result, bit for bit, with each value read once and written once per destination (why: docs/COMM.md,
// "The direct all-reduce on one host"). Two rendezvous through the notice boards at the start of each rank's
// ShmTransport segment: arrivals (the kind, tag, count and where the buffers lie; a mismatch throws as the ring does,
// and so does a message from a peer that is in another collective), then departures.
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "comm/ring_allreduce.h"
#include "comm/shm_transport.h"

namespace ddplab {

class DirectCollectives {
 public:
  enum class Kind : int32_t { kAllreduce, kReduceScatter, kAllGather };

  // Over `shm`'s segments and waits; shm must reach every rank (std::logic_error otherwise) and outlive this.
  explicit DirectCollectives(ShmTransport& shm);

  // Collective over the transport's ranks. Needs `in` and `out` in RegisteredBuffers that every rank maps; when some
  // rank's are not, every rank returns nullopt having touched nothing (the caller runs the ring). Otherwise whether
  // every sum is finite (options.check_finite; else true): every rank's sums for kAllreduce, this rank's own for
  // kReduceScatter. options: tag, final_scale, check_finite, and the ring's cut (slice_elems, slices_per_chunk);
  // fp32 only. Every rank must decide alike whether to call it (Communicator does).
  std::optional<bool> run(Kind kind, const float* in, float* out, size_t count, const RingOptions& options);

 private:
  struct Board;
  struct Arrivals;
  Board& board(int rank) const;
  void arrive(Kind kind, const float* in, float* out, size_t count, int tag);
  Arrivals gather_arrivals(Kind kind, const float* in, float* out, size_t count, int tag);
  uint64_t reduce_owned_chunks(Kind kind, const float* in, float* out, size_t count, const RingOptions& options);
  bool depart(Kind kind, uint64_t nonfinite, int unmapped, int tag);

  ShmTransport& shm_;
  int rank_ = 0, size_ = 1;
  uint64_t calls_ = 0;
  std::vector<const float*> ins_, sources_;  // per call, kept: no allocation per bucket
  std::vector<float*> outs_, targets_;
};

// The last-level cache as this machine's cpu 0 sees it (sysfs; 32 MiB where it does not say). An out-of-place direct
// all-reduce whose outputs together reach it stores with non-temporal stores.
size_t last_level_cache_bytes();

// Direct collectives this process ran since it started, all kinds together, and of those the ones that stored their
// outputs with non-temporal stores.
uint64_t shm_direct_collectives();
uint64_t shm_streamed_collectives();

}  // namespace ddplab
