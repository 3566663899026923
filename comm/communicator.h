// The communicator the training loop talks to: all-reduce on host fp32 buffers, by one of several
// implementations (our ring over a Transport, or the MPI library's MPI_Allreduce).
#pragma once
#include <mpi.h>

#include <cmath>
#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "comm/link_model.h"
#include "comm/recursive_doubling.h"
#include "comm/ring_allreduce.h"
#include "comm/shm_segments.h"
#include "comm/topology.h"
#include "comm/transport.h"
#include "runtime/choices.h"
#include "runtime/owned_comm.h"

namespace ddplab {

// kHier: the hierarchical all-reduce (comm/hier_allreduce.h), for more than one node. kNccl: NCCL's own, on GPU
// buffers only (--device cuda, train/cuda_backend.cpp); a Communicator refuses it.
enum class AllreduceImpl { kRing, kMpi, kHier, kNccl };
constexpr std::array<Named<AllreduceImpl>, 4> choice_names(AllreduceImpl) {
  return {{{AllreduceImpl::kRing, "ring"},
           {AllreduceImpl::kMpi, "mpi"},
           {AllreduceImpl::kHier, "hier"},
           {AllreduceImpl::kNccl, "nccl"}}};
}

// What travels on the wire. Buffers are always fp32 in memory; bf16/fp16 halve the bytes sent, with the sums
// accumulated in fp32 wherever the algorithm allows (docs/COMM.md: what is exact). --comm mpi refuses 16 bits.
enum class WireDtype { kFp32, kBf16, kFp16 };
constexpr std::array<Named<WireDtype>, 3> choice_names(WireDtype) {
  return {{{WireDtype::kFp32, "fp32"}, {WireDtype::kBf16, "bf16"}, {WireDtype::kFp16, "fp16"}}};
}
// The 16-bit format of a wire; none for fp32.
std::optional<float16::Format> wire_format(WireDtype dtype);

// The link of our ring on GPU buffers (--device cuda --comm ring; comm/ring_cuda.h): NCCL p2p, CUDA IPC, or staged
// through the host; auto takes the first that can connect.
enum class RingLinkKind { kAuto, kNccl, kIpc, kHost };
constexpr std::array<Named<RingLinkKind>, 4> choice_names(RingLinkKind) {
  return {{{RingLinkKind::kAuto, "auto"},
           {RingLinkKind::kNccl, "nccl"},
           {RingLinkKind::kIpc, "ipc"},
           {RingLinkKind::kHost, "host"}}};
}

// "none", or the link as it acts, overrides applied: "10gbe (10 us, 10 Gbit/s)".
std::string describe(const LinkModel& link);
// describe() of the one link, or "intra none, inter 10gbe (10 us, 10 Gbit/s)".
std::string describe(const LinkClasses& links);
// --link as typed: a preset for every hop ("25gbe"), or classes ("intra=nvlink4,inter=25gbe"; a class left out is
// none). The overrides apply to a single preset only. Throws std::invalid_argument naming the bad class or preset.
LinkClasses parse_links(const std::string& spec, double latency_us_override = -1, double gbps_override = -1);

// The ring implementation takes recursive doubling for fp32 buffers up to this many bytes at `ranks` ranks
// (DDPLAB_SMALL_ALLREDUCE_BYTES, or the measured crossover against the ring, or against the direct all-reduce where
// the Communicator takes it: Communicator::direct()).
size_t small_allreduce_bytes(int ranks, bool direct = false);

// Whether ranks all on one host may take the direct all-reduce (comm/shm_direct.h) at all: the ring on the fp32 wire,
// no emulated link. The Communicator takes it there where shared memory reaches every rank, the buffers are
// registered and DDPLAB_DIRECT_ALLREDUCE is 1; `ddplab predict` asks it of the settings it predicts.
bool direct_allreduce_allowed(AllreduceImpl impl, WireDtype wire, const LinkClasses& link);
// Whether a transport's name (Communicator::transport_name, as a run file or allreduce_perf's -J records it) says
// the direct collectives ran: the one reading of the name the Communicator gives.
bool names_direct_collectives(const std::string& transport_name);

// The ring on GPU buffers (comm/ring_cuda.h) all-reduces in rounds of ranks x this many bytes of fp32 words, each a
// whole ring of 2(n-1) steps (its default chunk, CudaRingConfig::chunk_bytes; here, where the CPU-only predictor reads
// it too).
inline constexpr size_t kGpuRingChunkBytes = size_t{64} << 20;
// Recursive doubling's exchanges a round (comm/recursive_doubling.h): log2 p, +2 for the ranks beyond the power of two
// p that fold in and out.
inline int doubling_steps(int ranks) { return DoublingGroup(ranks).exchanges(); }
// Whether --comm ring on GPU buffers may all-reduce by recursive doubling (doubling_allreduce_sum, comm/ring_device.h)
// instead of the ring: at two ranks, where it moves the ring's bytes, and wherever ranks share a GPU, where each
// exchange costs a fixed ~0.37 ms (2 ranks) to ~1.1 ms (4) whatever it moves. Between GPUs of their own, beyond two
// ranks, the ring's fewer bytes win, and so they do on a shared GPU under an emulated link (--link), which times each
// exchange by its bytes: callers pass ranks_share_a_gpu false there.
inline bool gpu_ring_may_double(int ranks, bool ranks_share_a_gpu) {
  return ranks == 2 || (ranks > 2 && ranks_share_a_gpu);
}
// What the engine's name (the run file's transport) ends with where it may: "ring/ipc + recursive doubling". Run
// files whose transport does not say so ran the ring throughout.
inline constexpr const char* kGpuRingDoublingName = " + recursive doubling";
// Whether it all-reduces `bytes` (fp32) so: where it may, and where its rounds of one chunk take fewer exchanges than
// the ring's rounds of ranks chunks. The same on every rank. Here, where the CPU-only predictor reads it too.
inline bool gpu_ring_doubles(int ranks, bool ranks_share_a_gpu, double bytes, double chunk_bytes) {
  if (!gpu_ring_may_double(ranks, ranks_share_a_gpu) || chunk_bytes <= 0) return false;
  const double doubling = doubling_steps(ranks) * std::ceil(bytes / chunk_bytes);
  const double ring = 2.0 * (ranks - 1) * std::ceil(bytes / (ranks * chunk_bytes));
  return doubling < ring;
}

// The ring's options as every Communicator sets them: slicing from runtime/settings.h (measured defaults), and the
// wire format. The hierarchical all-reduce (comm/hier_allreduce.h) runs its rings with the same.
RingOptions ring_options(WireDtype wire);

struct CommOptions {
  AllreduceImpl impl = AllreduceImpl::kRing;
  WireDtype wire = WireDtype::kFp32;
  LinkClasses link;
  int ranks_per_node = 0;  // emulated nodes of K consecutive ranks; 0: the hosts (comm/topology.h)
  // --comm ring with every rank on one host, single copy, the fp32 wire and no link emulation: registered buffers
  // above the recursive-doubling size take the direct collectives (comm/shm_direct.h: the all-reduce,
  // and the sharded update's reduce-scatter and all-gather) unless DDPLAB_DIRECT_ALLREDUCE is 0 or this is false
  // (allreduce_perf's ring-only).
  bool direct = true;
};

// Not thread-safe: one thread at a time calls into a Communicator (during a step, the Reducer's comm thread).
class DirectCollectives;
class HierAllreduce;
class LinkEmulatedTransport;
class SharedNic;

// The emulated links (--link) between the ranks of comm as the host ring's transport has them: each hop's class from
// the nodes (detect_topology: intra per pair, inter through the node's NIC), over an MPI transport of their own.
// Collective. For a link that moves its data another way and only needs each message's arrival: the GPU ring's
// (LinkEmulatedRingLink, comm/ring_device.h).
std::unique_ptr<LinkEmulatedTransport> emulated_link_clock(MPI_Comm comm, const LinkClasses& links, int ranks_per_node);

class Communicator {
 public:
  // Collective. The nodes come from options.ranks_per_node (detect_topology), or are given (tests: uneven nodes).
  // Throws std::invalid_argument for --comm hier on one node or on nodes of unequal size.
  Communicator(MPI_Comm comm, const CommOptions& options);
  Communicator(MPI_Comm comm, const CommOptions& options, const Topology& topology);
  Communicator(MPI_Comm comm, AllreduceImpl impl)
      : Communicator(comm, CommOptions{impl, WireDtype::kFp32, LinkModel{}}) {}
  ~Communicator();
  int rank() const { return rank_; }
  int size() const { return size_; }
  MPI_Comm mpi_comm() const { return comm_; }
  AllreduceImpl impl() const { return options_.impl; }
  const CommOptions& options() const { return options_; }
  const Topology& topology() const { return topology_; }
  // What the messages travel over on this rank, per kind of hop: "shm" (one node), "shm within node (1 peer) + mpi
  // across nodes (2 peers)", "mpi", with " + link emulation" when --link is on; "MPI_Allreduce" for --comm mpi.
  const std::string& transport_name() const { return transport_name_; }
  // Whether buffers from allocate_registered travel by reference between ranks of a host (comm/shm_transport.h):
  // the ring or hier reaches some peer through shared memory and DDPLAB_LOCAL_REGISTER is 1. transport_name() then
  // names that hop "shm single-copy" ("shm single-copy within node (1 peer) + mpi across nodes (2 peers)").
  bool single_copy() const { return single_copy_; }
  // Whether registered buffers take the direct collectives (CommOptions::direct); transport_name() then ends in
  // " + direct collectives".
  bool direct() const { return direct_ != nullptr; }
  // Collective over the communicator: `bytes` of zeroed host memory for buffers this rank all-reduces (the flat
  // gradients), registered with the shm transport when single_copy(), ordinary memory otherwise. Registration that
  // fails (a /dev/shm too small: the host's ranks agree on it, other hosts may still register) falls back to
  // ordinary memory for this buffer and the ones after it on that host: single_copy() and direct() turn false, said
  // on stderr and in transport_name(), and the buffers go by copy through the ring. It must outlive the all-reduces
  // that use it on every rank.
  RegisteredBuffer allocate_registered(size_t bytes);

  static constexpr int kMaxTag = 32767;  // the tag bound every MPI guarantees
  // data[i] = sum over ranks of data[i], in place. Same result on every rank, bit for bit. `tag` (0 .. kMaxTag;
  // std::invalid_argument otherwise) names the operation (the Reducer passes the bucket index): if ranks call with
  // different tags — buckets launched in a different order — ranks throw std::runtime_error("rank 1: all-reduce
  // order mismatch: this rank runs tag 3, rank 0 sent tag 2") instead of mixing buffers. With --comm mpi every
  // rank throws. With the ring every rank that receives a mismatching message throws (at n = 2 both do); a rank
  // whose neighbours both agree with it may instead wait on a rank that threw, until the program's edge calls
  // MPI_Abort. After any exception the Communicator refuses further calls (messages may be left in flight).
  void allreduce_sum(float* data, size_t count, int tag = 0);
  // Out of place: out[i] = sum over ranks of in[i]; `in` is only read (in == out is allreduce_sum). Same rules.
  void allreduce_sum_into(const float* in, float* out, size_t count, int tag = 0);
  // The gradients' all-reduce: data[i] = scale x sum over ranks of data[i] (scale 1/size: the mean, DDP's
  // semantics), in place, same rules; returns whether every result is finite. The flat fp32 ring scales and checks
  // each value where it becomes final (RingOptions' epilogue), so neither costs a pass over the buffer; the other
  // paths scale and check after the sum, in one pass (cpu::scale_and_check_finite), except the fp16 wire, which
  // scales each rank's values before the sum (its range ends at 65504) and checks after.
  bool allreduce_gradients(float* data, size_t count, float scale, int tag = 0);

  // The sharded update (ZeRO stage 1; comm/ring_allreduce.h, ring_reduce_scatter_sum): --comm ring on the fp32
  // wire only (std::logic_error otherwise). Same tag rules as the all-reduce.
  // Whether a `count`-element buffer is sharded: false at one rank, and for a buffer small enough for recursive
  // doubling, which is all-reduced whole and owned by every rank. The same on every rank for the same count.
  bool sharded(size_t count) const;
  // The elements of a `count`-element buffer this rank owns (all of them when not sharded).
  std::vector<RingChunk> owned_chunks(size_t count) const;
  // data[owned] = scale x sum over ranks of data[owned]; the other elements are left holding partial sums (the ring)
  // or what they held (the direct reduce-scatter): of no use either way. Returns whether every owned result is
  // finite.
  bool reduce_scatter_gradients(float* data, size_t count, float scale, int tag);
  // data[i] = its owner's data[i], for every element.
  void all_gather(float* data, size_t count, int tag);

 private:
  bool allreduce(const float* in, float* out, size_t count, int tag, float scale, bool check_finite);
  // Runs collective `what` with the checks and error handling every call shares: refused after an earlier failure,
  // tag in range, the watchdog armed (naming `waiting_in`), an order mismatch named.
  template <typename Op>
  auto guarded(const char* what, const char* waiting_in, int tag, Op op);
  void require_sharded_ring() const;
  bool small(size_t count) const;  // up to small_max_bytes_: recursive doubling, not the ring
  void mpi_allreduce_sum(const float* in, float* out, size_t count, int tag);
  void check_same_operation_everywhere(size_t count, int tag);  // --comm mpi: tags and counts agree on all ranks
  void name_transport();

  MPI_Comm comm_;
  int rank_ = 0, size_ = 1;
  CommOptions options_;
  Topology topology_;
  std::shared_ptr<SharedNic> nic_;        // this node's NIC, when inter-node hops are emulated
  std::unique_ptr<Transport> transport_;  // for the ring (possibly wrapped by link emulation)
  std::unique_ptr<HierAllreduce> hier_;   // --comm hier
  RingScratch scratch_;                   // receive/staging buffers of the ring and recursive doubling
  RingOptions ring_;                      // slice, wire format (the tag is set per call)
  size_t small_max_bytes_ = 0;            // buffers up to this size take recursive doubling instead of the ring
  OwnedComm mpi_comm_;                    // --comm mpi: a private duplicate, so callers' collectives never mix in
  std::string failed_;                    // set when an all-reduce threw: peers may have messages in flight
  std::string hops_;                      // the transports' own description (transport_table.h, hier's)
  std::string transport_name_;            // name_transport(): hops_ and what of single copy and direct is in use
  bool single_copy_ = false;
  bool registration_failed_ = false;           // allocate_registered fell back to ordinary memory
  std::unique_ptr<DirectCollectives> direct_;  // over transport_, when it takes the direct collectives
};

}  // namespace ddplab
