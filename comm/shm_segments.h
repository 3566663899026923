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
  // when `registered` is true on every rank of its host; otherwise (or after a failed shm_open/mmap, which every
  // rank of the host agrees on and throws as std::runtime_error naming it) it is ordinary memory.
  RegisteredBuffer(MPI_Comm comm, size_t bytes, bool registered);
  ~RegisteredBuffer();
  RegisteredBuffer(RegisteredBuffer&& other) noexcept;
  RegisteredBuffer& operator=(RegisteredBuffer&& other) noexcept;

  void* data() const { return base_; }
  size_t bytes() const { return bytes_; }
  bool registered() const { return segment_ != 0; }

 private:
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
};

// For the transports and collectives built on the segments, not for their users.
namespace shm_detail {

// Where a message sent by reference lies: bytes at offset `at` of segment `segment` of process `owner`.
struct Reference {
  uint64_t owner, segment, at;
};

// Names this process to its host peers in references.
uint64_t this_process();
// A segment's name in /dev/shm: /ddplab-<uid>-<kind>-<process>-<n>, `process` a this_process() id, so that a name is
// unique without relying on pids (which containers repeat: a stale segment of another container's process with this
// pid would otherwise refuse the name).
std::string segment_name(const char* kind, uint64_t process, uint64_t n);
// Creates segment `name` (exclusively) of `bytes` and returns its descriptor, or -1 with `error` set and nothing left
// in /dev/shm. With `allocate`, its memory is allocated now (posix_fallocate), so that a /dev/shm too small for it
// is this error, not a SIGBUS at the first write into a page tmpfs cannot give.
int create_segment(const std::string& name, size_t bytes, bool allocate, std::string& error);
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
