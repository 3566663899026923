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
#include <iterator>
#include <map>
#include <mutex>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>

#include "runtime/mpi_check.h"
#include "runtime/owned_comm.h"
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

namespace {

std::string segment_name(const char* kind, uint64_t pid, uint64_t process, uint64_t n) {
  return "/ddplab-" + std::to_string(getuid()) + "-" + kind + "-" + std::to_string(pid) + "-" +
         std::to_string(process) + "-" + std::to_string(n);
}

// The names of segments being set up (SharedSegments, steps 1-4), this process's and its peers'. The watchdog
// unlinks them before it aborts the job: a peer stopped or killed mid-setup cannot unlink its own.
std::mutex naming_mutex;
std::vector<std::string> names_in_setup;

void unlink_names_in_setup(void*) {
  std::lock_guard<std::mutex> lock(naming_mutex);
  for (const std::string& name : names_in_setup) shm_unlink(name.c_str());
}

// The names of one setup, from before any is created until every rank has opened every segment (or given up): then
// this rank unlinks them all, its peers' too (the same segments stay open, and shm_unlink of a name already gone
// is harmless), so a name goes as soon as any rank of the group gets there.
class NamesInSetup {
 public:
  explicit NamesInSetup(const std::vector<std::string>& names) {
    static const int hook = watchdog::add_abort_hook(unlink_names_in_setup, nullptr);  // once, for the process
    (void)hook;
    std::copy_if(names.begin(), names.end(), std::back_inserter(names_),
                 [](const std::string& n) { return !n.empty(); });
    std::lock_guard<std::mutex> lock(naming_mutex);
    names_in_setup.insert(names_in_setup.end(), names_.begin(), names_.end());
  }
  ~NamesInSetup() {
    for (const std::string& name : names_) shm_unlink(name.c_str());
    std::lock_guard<std::mutex> lock(naming_mutex);
    for (const std::string& name : names_)
      names_in_setup.erase(std::find(names_in_setup.begin(), names_in_setup.end(), name));
  }
  NamesInSetup(const NamesInSetup&) = delete;
  NamesInSetup& operator=(const NamesInSetup&) = delete;

 private:
  std::vector<std::string> names_;
};

}  // namespace

SharedSegments::SharedSegments(MPI_Comm group, const char* kind, size_t bytes, const std::string& who) {
  static std::atomic<uint64_t> next_id{1};
  int size = 1;
  mpiCheck(MPI_Comm_rank(group, &rank_));
  mpiCheck(MPI_Comm_size(group, &size));
  // Every rank's {pid, process, id, bytes}: its segment's name and size.
  const uint64_t mine[4] = {static_cast<uint64_t>(getpid()), this_process(), next_id++, bytes};
  std::vector<uint64_t> all(4 * static_cast<size_t>(size));
  mpiCheck(MPI_Allgather(mine, 4, MPI_UINT64_T, all.data(), 4, MPI_UINT64_T, group));
  std::vector<std::string> names(size);  // "" where a rank shares none
  segments_.resize(size);
  for (int r = 0; r < size; ++r) {
    const uint64_t* of = &all[4 * static_cast<size_t>(r)];
    segments_[r] = {of[1], of[2], of[3], -1};
    if (of[3] > 0) names[r] = segment_name(kind, of[0], of[1], of[2]);
  }
  const NamesInSetup in_setup(names);
  try {
    std::string error;
    if (bytes > 0) {
      Segment& own = segments_[rank_];
      own.fd = shm_open(names[rank_].c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
      if (own.fd < 0)
        error = "shm_open " + names[rank_] + ": " + errno_text();
      else if (ftruncate(own.fd, static_cast<off_t>(bytes)) != 0)
        error = "ftruncate " + names[rank_] + ": " + errno_text();
    }
    agree(group, error, who + "creating a segment of " + std::to_string(bytes) + " bytes");
    for (int r = 0; r < size && error.empty(); ++r) {
      if (r == rank_ || segments_[r].bytes == 0) continue;
      segments_[r].fd = shm_open(names[r].c_str(), O_RDWR, 0600);
      if (segments_[r].fd < 0) error = "shm_open " + names[r] + ": " + errno_text();
    }
    agree(group, error, who + "opening the peers' segments");
  } catch (...) {
    close_all();
    throw;
  }
}

SharedSegments::~SharedSegments() { close_all(); }

void SharedSegments::close_all() noexcept {
  for (Segment& s : segments_)
    if (s.fd >= 0) close(std::exchange(s.fd, -1));
}

std::string allocate(int fd, size_t bytes) {
  const int rc = posix_fallocate(fd, 0, static_cast<off_t>(bytes));
  if (rc == 0) return "";
  return "no room in /dev/shm for " + std::to_string(bytes) + " bytes (posix_fallocate: " + std::strerror(rc) +
         "): free or enlarge it (docker run --shm-size)";
}

void* map_shared(int fd, size_t bytes, bool populate, std::string& error) {
  void* m = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | (populate ? MAP_POPULATE : 0), fd, 0);
  if (m != MAP_FAILED) return m;
  error = "mmap: " + errno_text();
  return nullptr;
}

void agree(MPI_Comm group, const std::string& error, const std::string& what) {
  int ok = error.empty(), everyone = 0;
  mpiCheck(MPI_Allreduce(&ok, &everyone, 1, MPI_INT, MPI_MIN, group));
  if (!everyone) throw std::runtime_error(what + " failed" + (error.empty() ? " on another rank" : ": " + error));
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
  // The one collective over all of comm; the rest are the host's. A host whose registration fails therefore falls
  // back here, in step with hosts where it succeeds, instead of running a collective of its own over comm.
  OwnedComm host;
  mpiCheck(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, host.receive()));
  MPI_Comm_size(host, &host_size);
  MPI_Allreduce(&want, &all, 1, MPI_INT, MPI_MIN, host);
  if (all && host_size > 1) {  // else nobody could read it by reference
    try {
      register_on_host(host, "rank " + std::to_string(rank) + ": RegisteredBuffer: ");
    } catch (const std::runtime_error& e) {  // thrown by every rank of the host alike
      release();
      registration_error_ = e.what();
    }
  }
  host.reset();
  if (segment_) return;
  base_ = mmap(nullptr, map_bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);  // private, zeroed
  if (base_ == MAP_FAILED) {
    base_ = nullptr;
    throw std::runtime_error("rank " + std::to_string(rank) + ": RegisteredBuffer: mmap of " + std::to_string(bytes) +
                             " bytes: " + errno_text());
  }
}

// Every step that can fail is agreed on by the host's ranks (shm_detail::agree), so all register or all throw.
void RegisteredBuffer::register_on_host(MPI_Comm host, const std::string& who) {
  const shm_detail::SharedSegments shared(host, "registered", map_bytes_, who);
  // Allocated and mapped by the owner before any peer maps it: its pages are placed where it runs, and no first
  // touch lands in a step.
  std::string error = shm_detail::allocate(shared.own().fd, map_bytes_);
  if (error.empty()) base_ = shm_detail::map_shared(shared.own().fd, map_bytes_, /*populate=*/true, error);
  shm_detail::agree(host, error, who + "allocating " + std::to_string(map_bytes_) + " bytes");
  std::vector<uint64_t> readers;
  for (int h = 0; h < shared.size() && error.empty(); ++h) {
    const shm_detail::SharedSegments::Segment& peer = shared[h];
    if (h == shared.rank()) continue;
    readers.push_back(peer.process);
    // Writable: the direct collectives store each rank's chunks into its peers' outputs (comm/shm_direct.h).
    if (void* m = shm_detail::map_shared(peer.fd, peer.bytes, /*populate=*/true, error))
      peer_maps_.push_back({peer.process, peer.id, m, peer.bytes});
  }
  shm_detail::agree(host, error, who + "mapping the peers' segments");
  segment_ = shared.own().id;
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
    registration_error_ = std::move(other.registration_error_);
  }
  return *this;
}

}  // namespace ddplab
