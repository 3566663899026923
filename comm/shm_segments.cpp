// Shared segments: the registry of RegisteredBuffers (see comm/shm_segments.h), and where their pages lie.
#include "comm/shm_segments.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>

#include "runtime/mpi_check.h"
#include "runtime/watchdog.h"

namespace ddplab {

namespace {

size_t round_up(size_t x, size_t to) { return (x + to - 1) / to * to; }

// The segments mapped by live transports (for shm_page_placement), with their sizes.
std::mutex mapped_mutex;
std::vector<std::pair<void*, size_t>> mapped_segments;

// RegisteredBuffers: this process's own segments, and the host peers' segments it maps. Transports on any thread
// look them up per message (sender: is this range registered, and does the receiver map it? receiver: where is
// that reference here?); a lookup is a map search under an uncontended mutex, small next to a message of KiBs.
struct OwnSegment {
  size_t bytes;
  uint64_t id;
  std::vector<uint64_t> readers;  // the processes that map it
};
struct PeerSegment {
  char* base;
  size_t bytes;
};
std::mutex registry_mutex;
std::map<const char*, OwnSegment> own_segments;                      // by base address
std::map<std::pair<uint64_t, uint64_t>, PeerSegment> peer_segments;  // by (owner process, segment id)

int numa_nodes() {
  int nodes = 0;
  for (int node = 0; node < 4096; ++node) {
    const std::string path = "/sys/devices/system/node/node" + std::to_string(node);
    if (access(path.c_str(), F_OK) != 0) break;
    ++nodes;
  }
  return std::max(nodes, 1);
}

}  // namespace

namespace shm_detail {

std::string errno_text() { return std::strerror(errno); }

// Names this process to its host peers in references: random, so it is unique without relying on pids (which
// containers may repeat).
uint64_t this_process() {
  static const uint64_t id = [] {
    std::random_device entropy;
    uint64_t v = 0;
    while (v == 0) v = (uint64_t{entropy()} << 32) ^ entropy() ^ static_cast<uint64_t>(getpid());
    return v;
  }();
  return id;
}

std::string segment_name(const char* kind, uint64_t process, uint64_t n) {
  return "/ddplab-" + std::to_string(getuid()) + "-" + kind + "-" + std::to_string(process) + "-" + std::to_string(n);
}

int create_segment(const std::string& name, size_t bytes, bool allocate, std::string& error) {
  const int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) {
    error = "shm_open " + name + ": " + errno_text();
    return -1;
  }
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    error = "ftruncate: " + errno_text();
  } else if (allocate) {
    const int rc = posix_fallocate(fd, 0, static_cast<off_t>(bytes));
    if (rc != 0)
      error = "no room in /dev/shm for " + std::to_string(bytes) + " bytes (posix_fallocate: " + std::strerror(rc) +
              "): free or enlarge it (docker run --shm-size)";
  }
  if (error.empty()) return fd;
  close(fd);
  shm_unlink(name.c_str());
  return -1;
}

// A send of [buf, buf + bytes) to `reader` may go by reference: fills `ref` when the range lies in one of this
// process's registered segments and `reader` maps it.
bool find_reference(const void* buf, size_t bytes, uint64_t reader, Reference& ref) {
  const char* p = static_cast<const char*>(buf);
  std::lock_guard<std::mutex> lock(registry_mutex);
  auto it = own_segments.upper_bound(p);
  if (it == own_segments.begin()) return false;
  --it;
  const OwnSegment& seg = it->second;
  if (p + bytes > it->first + seg.bytes) return false;
  if (std::find(seg.readers.begin(), seg.readers.end(), reader) == seg.readers.end()) return false;
  ref = {this_process(), seg.id, static_cast<uint64_t>(p - it->first)};
  return true;
}

// Where the referenced range lies in this process, or null when it maps no such segment (or the range is outside).
char* resolve(const Reference& ref, size_t bytes) {
  std::lock_guard<std::mutex> lock(registry_mutex);
  auto it = peer_segments.find({ref.owner, ref.segment});
  if (it == peer_segments.end() || ref.at > it->second.bytes || bytes > it->second.bytes - ref.at) return nullptr;
  return it->second.base + ref.at;
}

void note_mapped(void* base, size_t bytes) {
  std::lock_guard<std::mutex> lock(mapped_mutex);
  mapped_segments.emplace_back(base, bytes);
}

void forget_mapped(void* base, size_t bytes) {
  std::lock_guard<std::mutex> lock(mapped_mutex);
  mapped_segments.erase(std::remove(mapped_segments.begin(), mapped_segments.end(), std::make_pair(base, bytes)),
                        mapped_segments.end());
}

}  // namespace shm_detail

using shm_detail::errno_text;
using shm_detail::this_process;

std::string shm_page_placement() {
  const long page = sysconf(_SC_PAGESIZE);
  std::vector<void*> pages;
  {
    std::lock_guard<std::mutex> lock(mapped_mutex);
    for (const auto& [base, bytes] : mapped_segments)
      for (size_t at = 0; at < bytes; at += static_cast<size_t>(page)) pages.push_back(static_cast<char*>(base) + at);
  }
  const int nodes = numa_nodes();
  std::string text = std::to_string(nodes) + (nodes == 1 ? " NUMA node:" : " NUMA nodes:");
  if (pages.empty()) return text + " no shared segment mapped";
  // move_pages with no target nodes moves nothing: it reports each page's node, or -errno (-ENOENT: not present).
  std::vector<int> status(pages.size(), 0);
  if (syscall(SYS_move_pages, 0, pages.size(), pages.data(), nullptr, status.data(), 0) != 0)
    return text + " move_pages: " + errno_text();
  std::map<int, size_t> per_node;
  for (int s : status) ++per_node[s];
  for (const auto& [node, n] : per_node) {
    text += " " + std::to_string(n) + " pages ";
    if (node >= 0)
      text += "on node " + std::to_string(node);
    else if (node == -ENOENT)
      text += "not yet placed";
    else
      text += "unknown (" + std::string(std::strerror(-node)) + ")";
    text += ",";
  }
  text.pop_back();
  return text;
}

RegisteredBuffer::RegisteredBuffer(MPI_Comm comm, size_t bytes, bool registered) : bytes_(bytes) {
  // Collectives of the host's ranks, also between measurements (allreduce_perf registers each size's buffers): a peer
  // stopped meanwhile must end the job, not leave this rank in MPI_Allreduce for good.
  const watchdog::Wait wait("registering a buffer with the host's ranks");
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  map_bytes_ = round_up(std::max<size_t>(bytes, 1), page);
  int rank = 0, host_size = 1, want = registered, all = 0;
  mpiCheck(MPI_Comm_rank(comm, &rank));
  MPI_Comm host;
  mpiCheck(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &host));
  MPI_Comm_size(host, &host_size);
  MPI_Allreduce(&want, &all, 1, MPI_INT, MPI_MIN, host);
  if (!all || host_size == 1) {  // nobody could read it by reference: ordinary (private, zeroed) pages
    MPI_Comm_free(&host);
    base_ = mmap(nullptr, map_bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (base_ == MAP_FAILED) {
      base_ = nullptr;
      throw std::runtime_error("rank " + std::to_string(rank) + ": RegisteredBuffer: mmap of " + std::to_string(bytes) +
                               " bytes: " + errno_text());
    }
    return;
  }
  static std::atomic<uint64_t> next_segment{1};
  const uint64_t segment = next_segment++;
  const std::string mine = shm_detail::segment_name("registered", shm_detail::this_process(), segment);
  // As in ShmTransport's setup: every step that can fail is agreed on by the host's ranks, so all register or all
  // throw; the name is unlinked once every peer has mapped the segment.
  std::string error;
  bool created = false;  // the name is ours to unlink
  auto agree = [&](const std::string& what) {
    int ok = error.empty(), everyone = 0;
    MPI_Allreduce(&ok, &everyone, 1, MPI_INT, MPI_MIN, host);
    if (everyone) return;
    if (created) shm_unlink(mine.c_str());
    MPI_Comm_free(&host);
    release();
    throw std::runtime_error("rank " + std::to_string(rank) + ": RegisteredBuffer: " + what + " failed" +
                             (error.empty() ? " on another rank" : ": " + error));
  };
  // Allocated and mapped now, by the owner: its pages are placed where it runs, and no first touch lands in a step.
  const int fd = shm_detail::create_segment(mine, map_bytes_, /*allocate=*/true, error);
  if (fd >= 0) {
    created = true;
    void* m = mmap(nullptr, map_bytes_, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
    if (m == MAP_FAILED) error = "mmap: " + errno_text();
    if (m != MAP_FAILED) base_ = m;
    close(fd);
  }
  agree("creating a segment of " + std::to_string(map_bytes_) + " bytes");
  // Every rank of the host: {process, segment, bytes}.
  const uint64_t me[3] = {this_process(), segment, map_bytes_};
  std::vector<uint64_t> all_of(3 * static_cast<size_t>(host_size));
  MPI_Allgather(me, 3, MPI_UINT64_T, all_of.data(), 3, MPI_UINT64_T, host);
  std::vector<uint64_t> readers;
  for (int h = 0; h < host_size; ++h) {
    const uint64_t* peer = &all_of[3 * static_cast<size_t>(h)];
    if (peer[0] == this_process()) continue;
    readers.push_back(peer[0]);
    if (!error.empty()) continue;
    const std::string name = shm_detail::segment_name("registered", peer[0], peer[1]);
    const int pfd = shm_open(name.c_str(), O_RDWR, 0600);
    if (pfd < 0) {
      error = "shm_open " + name + ": " + errno_text();
      continue;
    }
    // Writable: the direct collectives store each rank's chunks into its peers' outputs
    // (comm/shm_direct.h).
    void* m = mmap(nullptr, peer[2], PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, pfd, 0);
    close(pfd);
    if (m == MAP_FAILED)
      error = "mmap of " + name + ": " + errno_text();
    else
      peer_maps_.push_back({peer[0], peer[1], m, peer[2]});
  }
  agree("mapping the peers' segments");
  shm_unlink(mine.c_str());
  MPI_Comm_free(&host);
  segment_ = segment;
  std::lock_guard<std::mutex> lock(registry_mutex);
  own_segments[static_cast<const char*>(base_)] = {bytes_, segment_, readers};
  for (const PeerMap& p : peer_maps_) peer_segments[{p.owner, p.segment}] = {static_cast<char*>(p.base), p.map_bytes};
}

void RegisteredBuffer::release() noexcept {
  {
    std::lock_guard<std::mutex> lock(registry_mutex);
    if (segment_) own_segments.erase(static_cast<const char*>(base_));
    for (const PeerMap& p : peer_maps_) peer_segments.erase({p.owner, p.segment});
  }
  for (const PeerMap& p : peer_maps_) munmap(p.base, p.map_bytes);
  peer_maps_.clear();
  if (base_) munmap(base_, map_bytes_);
  base_ = nullptr;
  segment_ = 0;
}

RegisteredBuffer::~RegisteredBuffer() { release(); }

RegisteredBuffer::RegisteredBuffer(RegisteredBuffer&& other) noexcept { *this = std::move(other); }

RegisteredBuffer& RegisteredBuffer::operator=(RegisteredBuffer&& other) noexcept {
  if (this != &other) {
    release();
    base_ = std::exchange(other.base_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
    map_bytes_ = std::exchange(other.map_bytes_, 0);
    segment_ = std::exchange(other.segment_, 0);
    peer_maps_ = std::move(other.peer_maps_);
    other.peer_maps_.clear();
  }
  return *this;
}

}  // namespace ddplab
