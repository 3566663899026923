// Shared memory that the ranks of one host map: RegisteredBuffers (single copy: a send from one travels by
// reference, the receiver reads the sender's memory), and the registry the transports look references up in.
// comm/shm_transport.h sends through it; comm/shm_direct.h reads and writes every rank's buffers where they lie.
#pragma once
#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace ddplab {

// Where the pages of every shared segment this process has mapped now lie: pages per NUMA node (move_pages), and the
// pages not yet placed (never touched) or not answerable. One line, e.g. "1 NUMA node: 514 pages on node 0".
std::string shm_page_placement();

// Host memory in a shared segment that the ranks of this host map: sends from it travel by reference.
// Not copyable; the mappings go when it is destroyed, on every rank after the last all-reduce that uses it (a
// reference to a segment a receiver no longer maps fails that receive with a message, never reads freed memory).
class RegisteredBuffer {
 public:
  RegisteredBuffer() = default;
  // Collective over comm: each rank gets `bytes` of zeroed memory (sizes may differ between ranks). It is registered
  // when `registered` is true on every rank of its host; otherwise, or when registering fails (a /dev/shm too small:
  // every rank of the host agrees on it, and registration_error() says why), it is ordinary memory. Either way the
  // only collective over all of comm is one host split, so hosts that fail and hosts that do not stay in step.
  // Throws only when even ordinary memory cannot be had.
  RegisteredBuffer(MPI_Comm comm, size_t bytes, bool registered);
  ~RegisteredBuffer();
  RegisteredBuffer(RegisteredBuffer&& other) noexcept;
  RegisteredBuffer& operator=(RegisteredBuffer&& other) noexcept;

  void* data() const { return base_; }
  size_t bytes() const { return bytes_; }
  bool registered() const { return segment_ != 0; }
  // Why this rank's host could not register it ("rank 1: RegisteredBuffer: allocating ... failed: no room in
  // /dev/shm ..."); empty when it is registered or was not asked to be.
  const std::string& registration_error() const { return registration_error_; }

 private:
  void register_on_host(MPI_Comm host, const std::string& who);
  void release() noexcept;
  void* base_ = nullptr;
  size_t bytes_ = 0, map_bytes_ = 0;
  uint64_t segment_ = 0;  // this process's id of its segment; 0: ordinary memory
  struct PeerMap {
    uint64_t owner, segment;
    void* base;
    size_t map_bytes;
  };
  std::vector<PeerMap> peer_maps_;  // the host peers' segments of the same collective call
  std::string registration_error_;
};

// For the transports and collectives built on the segments, not for their users.
namespace shm_detail {

// Where a message sent by reference lies: bytes at offset `at` of segment `segment` of process `owner`.
struct Reference {
  uint64_t owner, segment, at;
};

// Names this process to its host peers in references.
uint64_t this_process();

// Every rank's segment of one collective setup over `group` (the ranks of a host, or of a node on it), open on this
// rank: rank r shares one of its own `bytes` (0: none). The one lifecycle of every named segment (RegisteredBuffer,
// ShmTransport's FIFOs, SharedNic):
//   1. the ranks exchange their segments' names: all have arrived before any name exists;
//   2. each creates its own (shm_open O_EXCL, ftruncate: no memory yet); all agree;
//   3. each opens its peers'; all agree;
//   4. each unlinks every name of the group (the first to come removes it).
// Allocating, mapping and faulting in come afterwards, through the descriptors: a name lives only across two small
// agreements of ranks that are all there. A watchdog abort in that window unlinks the whole group's names first, a
// stopped peer's too, so nothing is left in /dev/shm; only a job killed outright at that moment can leave one. Names,
// not memfd_create: a descriptor reaches another process only over a Unix socket.
// A name is /ddplab-<uid>-<kind>-<pid>-<this_process()>-<n>: the pid says whose it is, the random process id keeps
// it unique where pids repeat (containers sharing /dev/shm).
class SharedSegments {
 public:
  struct Segment {
    uint64_t process = 0, id = 0;  // its owner's this_process() and number for it, as a Reference names them
    size_t bytes = 0;              // 0: that rank shares none
    int fd = -1;
  };
  // Throws std::runtime_error("<who>creating a segment of N bytes failed: ...") on every rank of group alike when a
  // segment could not be created or opened anywhere; nothing is left in /dev/shm then either.
  SharedSegments(MPI_Comm group, const char* kind, size_t bytes, const std::string& who);
  ~SharedSegments();  // closes the descriptors; mappings made through them stay
  SharedSegments(const SharedSegments&) = delete;
  SharedSegments& operator=(const SharedSegments&) = delete;

  const Segment& operator[](int rank) const { return segments_[rank]; }
  const Segment& own() const { return segments_[rank_]; }
  int size() const { return static_cast<int>(segments_.size()); }
  int rank() const { return rank_; }  // in group

 private:
  void close_all() noexcept;
  int rank_ = 0;
  std::vector<Segment> segments_;
};

// Allocates a segment's memory now (posix_fallocate), so that a /dev/shm too small for it is this error, not a
// SIGBUS at the first write into a page tmpfs cannot give. Returns what failed, or "".
std::string allocate(int fd, size_t bytes);
// Maps `bytes` of a segment read-write and shared, with `populate` faulting its pages in now; null with `error`
// set when it fails.
void* map_shared(int fd, size_t bytes, bool populate, std::string& error);
// Every rank of group learns whether all have an empty `error`; where one has not, every rank throws
// std::runtime_error (`what` + " failed: " + error, or " failed on another rank"), so that all take the same path.
void agree(MPI_Comm group, const std::string& error, const std::string& what);

// A send of [buf, buf + bytes) to process `reader` may go by reference: fills `ref` when the range lies in one of
// this process's registered segments and `reader` maps it.
bool find_reference(const void* buf, size_t bytes, uint64_t reader, Reference& ref);
// Where the referenced range lies in this process, or null when it maps no such segment (or the range is outside).
char* resolve(const Reference& ref, size_t bytes);
// A segment mapped by a transport, counted by shm_page_placement while mapped.
void note_mapped(void* base, size_t bytes);
void forget_mapped(void* base, size_t bytes);
std::string errno_text();

}  // namespace shm_detail

}  // namespace ddplab
