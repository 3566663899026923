#include "comm/shm_transport.h"

#include <fcntl.h>
#include <immintrin.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>

#include "runtime/mpi_check.h"
#include "runtime/watchdog.h"
#include "kernels/cpu/ops.h"

namespace ddplab {

namespace {

constexpr size_t kLine = 64;
constexpr size_t kSlots = 64;          // records in flight per FIFO
constexpr size_t kPiece = 32 << 10;    // the consumer releases payload space in pieces this large (pipelining)
constexpr int64_t kPureSpinNs = 2000;  // waiting: spin this long before yielding the core between polls

// Every message has a record in the FIFO's slot ring; `seq` (the message's number on this FIFO, from 1) is
// written last, with release semantics, and the receiver polls it in the slot where the next record must appear:
// it learns that a message is there from the record's own cache line, without reading a counter of the sender's.
// The slots only ever hold records, so a stale slot holds an older number, never a false match. Payloads up to
// kInline bytes travel inside the record (a small message is one cache line, like Open MPI's "fast boxes");
// larger ones stream through the payload ring.
struct Record {
  uint64_t seq;
  uint64_t bytes;
  int32_t tag;
  int32_t by_reference;  // the payload holds a Reference: the data stays in the sender's RegisteredBuffer
  char payload[40];
};
static_assert(sizeof(Record) == kLine, "one cache line");
constexpr size_t kInline = sizeof(Record::payload);

// Where a message sent by reference lies: `bytes` (the record's) at offset `at` of the sender's segment.
struct Reference {
  uint64_t owner, segment, at;  // the sending process (this_process()), its segment id, the offset
};
static_assert(sizeof(Reference) <= kInline, "a reference travels inside its record");

}  // namespace

// One direction between two ranks, in shared memory: counters on their own cache lines, the slot ring of
// records, then the payload ring. Counters only grow: head - tail is the payload ring's fill level and position =
// counter % capacity; both stay multiples of 64.
struct ShmTransport::Fifo {
  alignas(64) std::atomic<uint64_t> head;        // payload bytes written (producer)
  alignas(64) std::atomic<uint64_t> tail;        // payload bytes consumed (consumer)
  alignas(64) std::atomic<uint64_t> slots_done;  // records consumed (consumer)
  Record* slots() { return reinterpret_cast<Record*>(this + 1); }
  char* data() { return reinterpret_cast<char*>(slots() + kSlots); }
};
static_assert(sizeof(ShmTransport::Fifo) == 3 * kLine, "three cache lines of counters, then the slots");

// A rank's notices to its host peers for the direct all-reduce, each on its own cache line, written by the rank only:
// its arrival at a call (what it all-reduces and where its buffers lie), then its departure (done with every rank's
// buffers). `call` is written last, with release semantics; calls are numbered from 1 on each transport.
struct ShmTransport::Board {
  struct alignas(64) Arrival {
    uint64_t call;
    uint64_t count;
    int32_t tag;
    int32_t kind;                // ShmTransport::Direct
    int32_t registered;          // in and out lie in segments every host peer maps (then the fields below apply)
    uint64_t in_segment, in_at;  // where `in` lies in this rank's process: segment id and offset
    uint64_t out_segment, out_at;
  } arrival;
  struct alignas(64) Departure {
    uint64_t call;
    uint64_t nonfinite;  // blocks of this rank's chunks whose sums were not all finite (when checked)
    uint64_t unmapped;   // 1 + a peer whose buffers this rank could not find in its mappings; 0: none
  } departure;
};
static_assert(sizeof(ShmTransport::Board) == 2 * kLine, "two cache lines");

namespace {

static_assert(std::atomic<uint64_t>::is_always_lock_free, "shared-memory counters must be lock-free");

size_t round_up(size_t x, size_t to) { return (x + to - 1) / to * to; }

int64_t now_ns() {
  timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return int64_t{t.tv_sec} * 1'000'000'000 + t.tv_nsec;
}

// Copies n bytes to/from the ring at position pos (mod capacity), wrapping around its end.
void copy_in(char* ring, size_t cap, uint64_t pos, const char* src, size_t n) {
  const size_t at = pos % cap, first = std::min(n, cap - at);
  std::memcpy(ring + at, src, first);
  if (n > first) std::memcpy(ring, src + first, n - first);
}

std::string errno_text() { return std::strerror(errno); }

// ShmWaitStats, as relaxed atomics: transports on several threads (the Reducer's and an extra communicator's)
// may wait at once.
struct WaitCounters {
  std::atomic<uint64_t> waits{0}, spin_polls{0}, yield_polls{0}, sleeps{0}, wait_ns{0}, sleep_ns{0};
};
WaitCounters wait_counters;
std::atomic<uint64_t> sent_by_reference{0}, sent_copied{0}, direct_collectives{0}, streamed_collectives{0};
void count(std::atomic<uint64_t>& counter, uint64_t n = 1) { counter.fetch_add(n, std::memory_order_relaxed); }

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
std::map<const char*, OwnSegment> own_segments;                       // by base address
std::map<std::pair<uint64_t, uint64_t>, PeerSegment> peer_segments;  // by (owner process, segment id)

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

std::string segment_name(long pid, uint64_t segment) {
  return "/ddplab-" + std::to_string(getuid()) + "-" + std::to_string(pid) + "-registered-" + std::to_string(segment);
}

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

ShmWaitStats ShmWaitStats::operator-(const ShmWaitStats& e) const {
  return {waits - e.waits,   spin_polls - e.spin_polls, yield_polls - e.yield_polls,
          sleeps - e.sleeps, wait_ns - e.wait_ns,       sleep_ns - e.sleep_ns};
}

ShmWaitStats& ShmWaitStats::operator+=(const ShmWaitStats& m) {
  waits += m.waits, spin_polls += m.spin_polls, yield_polls += m.yield_polls;
  sleeps += m.sleeps, wait_ns += m.wait_ns, sleep_ns += m.sleep_ns;
  return *this;
}

ShmWaitStats shm_wait_stats() {
  const WaitCounters& c = wait_counters;
  const auto get = [](const std::atomic<uint64_t>& v) { return v.load(std::memory_order_relaxed); };
  return {get(c.waits), get(c.spin_polls), get(c.yield_polls), get(c.sleeps), get(c.wait_ns), get(c.sleep_ns)};
}

ShmSendCounts shm_send_counts() {
  return {sent_by_reference.load(std::memory_order_relaxed), sent_copied.load(std::memory_order_relaxed)};
}

uint64_t shm_direct_collectives() { return direct_collectives.load(std::memory_order_relaxed); }
uint64_t shm_streamed_collectives() { return streamed_collectives.load(std::memory_order_relaxed); }

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
      throw std::runtime_error("rank " + std::to_string(rank) + ": RegisteredBuffer: mmap of " +
                               std::to_string(bytes) + " bytes: " + errno_text());
    }
    return;
  }
  static std::atomic<uint64_t> next_segment{1};
  const uint64_t segment = next_segment++;
  const std::string mine = segment_name(getpid(), segment);
  // As in ShmTransport's setup: every step that can fail is agreed on by the host's ranks, so all register or all
  // throw; the name is unlinked once every peer has mapped the segment.
  std::string error;
  auto agree = [&](const std::string& what) {
    int ok = error.empty(), everyone = 0;
    MPI_Allreduce(&ok, &everyone, 1, MPI_INT, MPI_MIN, host);
    if (everyone) return;
    shm_unlink(mine.c_str());
    MPI_Comm_free(&host);
    release();
    throw std::runtime_error("rank " + std::to_string(rank) + ": RegisteredBuffer: " + what + " failed" +
                             (error.empty() ? " on another rank" : ": " + error));
  };
  const int fd = shm_open(mine.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) {
    error = "shm_open " + mine + ": " + errno_text();
  } else {
    if (ftruncate(fd, static_cast<off_t>(map_bytes_)) != 0) error = "ftruncate: " + errno_text();
    // Populated now, by the owner: its pages are allocated where it runs, and no first touch lands in a step.
    void* m = error.empty() ? mmap(nullptr, map_bytes_, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0)
                            : MAP_FAILED;
    if (error.empty() && m == MAP_FAILED) error = "mmap: " + errno_text();
    if (m != MAP_FAILED) base_ = m;
    close(fd);
  }
  agree("creating a segment of " + std::to_string(map_bytes_) + " bytes");
  // Every rank of the host: {process, pid, segment, bytes}.
  const uint64_t me[4] = {this_process(), static_cast<uint64_t>(getpid()), segment, map_bytes_};
  std::vector<uint64_t> all_of(4 * static_cast<size_t>(host_size));
  MPI_Allgather(me, 4, MPI_UINT64_T, all_of.data(), 4, MPI_UINT64_T, host);
  std::vector<uint64_t> readers;
  for (int h = 0; h < host_size; ++h) {
    const uint64_t* peer = &all_of[4 * static_cast<size_t>(h)];
    if (peer[0] == this_process()) continue;
    readers.push_back(peer[0]);
    if (!error.empty()) continue;
    const std::string name = segment_name(static_cast<long>(peer[1]), peer[2]);
    const int pfd = shm_open(name.c_str(), O_RDWR, 0600);
    if (pfd < 0) {
      error = "shm_open " + name + ": " + errno_text();
      continue;
    }
    // Writable: the direct collectives store each rank's chunks into its peers' outputs
    // (ShmTransport::direct_collective).
    void* m = mmap(nullptr, peer[3], PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, pfd, 0);
    close(pfd);
    if (m == MAP_FAILED)
      error = "mmap of " + name + ": " + errno_text();
    else
      peer_maps_.push_back({peer[0], peer[2], m, peer[3]});
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

ShmTransport::ShmTransport(MPI_Comm comm, const std::vector<int>& node_of_rank, size_t fifo_bytes, PollPolicy poll)
    : fifo_bytes_(std::max<size_t>(round_up(fifo_bytes, kLine), 2 * kLine)), poll_(poll) {
  remote_ = std::make_unique<MpiTransport>(comm, MpiTransport::kMaxMessageBytes, poll);  // collective
  rank_ = remote_->rank();
  size_ = remote_->size();
  to_.assign(size_, nullptr);
  from_.assign(size_, nullptr);
  peers_.assign(size_, Peer{});

  // The ranks of this host, then of them those on this rank's node (an emulated node may span hosts).
  MPI_Comm host, local;
  mpiCheck(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &host));
  const int node = node_of_rank.empty() ? 0 : node_of_rank.at(rank_);
  mpiCheck(MPI_Comm_split(host, node, rank_, &local));
  mpiCheck(MPI_Comm_free(&host));
  int lrank = 0, lsize = 1;
  MPI_Comm_rank(local, &lrank);
  MPI_Comm_size(local, &lsize);
  std::vector<int> world_of(lsize);
  MPI_Allgather(&rank_, 1, MPI_INT, world_of.data(), 1, MPI_INT, local);
  std::vector<uint64_t> process_of_local(lsize);
  const uint64_t me = this_process();
  MPI_Allgather(&me, 1, MPI_UINT64_T, process_of_local.data(), 1, MPI_UINT64_T, local);
  process_of_.assign(size_, 0);
  for (int l = 0; l < lsize; ++l) process_of_[world_of[l]] = process_of_local[l];

  // A name unique to this transport: local rank 0's pid and a per-process counter.
  static std::atomic<int> counter{0};
  long id[2] = {static_cast<long>(getpid()), counter++};
  MPI_Bcast(id, 2, MPI_LONG, 0, local);
  auto name = [&](int l) {
    return "/ddplab-" + std::to_string(getuid()) + "-" + std::to_string(id[0]) + "-" + std::to_string(id[1]) + "-" +
           std::to_string(l);
  };
  const size_t stride = sizeof(Fifo) + kSlots * sizeof(Record) + fifo_bytes_;
  map_bytes_ = sizeof(Board) + stride * lsize;

  // Every step that can fail is agreed on by all local ranks, so either all use shared memory or all throw.
  std::string error;
  auto agree = [&](const std::string& what) {
    int ok = error.empty(), all = 0;
    MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, local);
    if (!all) {
      for (void* m : maps_) munmap(m, map_bytes_);
      maps_.clear();
      shm_unlink(name(lrank).c_str());
      MPI_Comm_free(&local);
      throw std::runtime_error("rank " + std::to_string(rank_) + ": ShmTransport: " + what + " failed" +
                               (error.empty() ? " on another rank" : ": " + error));
    }
  };
  void* mine = MAP_FAILED;
  const int fd = shm_open(name(lrank).c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) {
    error = "shm_open " + name(lrank) + ": " + errno_text();
  } else {
    if (ftruncate(fd, static_cast<off_t>(map_bytes_)) != 0) error = "ftruncate: " + errno_text();
    if (error.empty()) mine = mmap(nullptr, map_bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (error.empty() && mine == MAP_FAILED) error = "mmap: " + errno_text();
    close(fd);
  }
  if (mine != MAP_FAILED) maps_.push_back(mine);
  agree("creating the segment");
  std::vector<char*> base(lsize, nullptr);
  base[lrank] = static_cast<char*>(mine);
  for (int l = 0; l < lsize && error.empty(); ++l) {
    if (l == lrank) continue;
    const int pfd = shm_open(name(l).c_str(), O_RDWR, 0600);
    if (pfd < 0) {
      error = "shm_open " + name(l) + ": " + errno_text();
      break;
    }
    void* m = mmap(nullptr, map_bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, pfd, 0);
    close(pfd);
    if (m == MAP_FAILED) {
      error = "mmap: " + errno_text();
      break;
    }
    maps_.push_back(m);
    base[l] = static_cast<char*>(m);
  }
  agree("mapping the peers' segments");
  {
    std::lock_guard<std::mutex> lock(mapped_mutex);
    for (void* m : maps_) mapped_segments.emplace_back(m, map_bytes_);
  }
  shm_unlink(name(lrank).c_str());  // everyone has it mapped: the name can go, the memory stays while mapped

  // Segment of rank l holds l's board, then the FIFOs into l, one per local sender (by local rank).
  boards_.assign(size_, nullptr);
  for (int l = 0; l < lsize; ++l) {
    const int p = world_of[l];
    boards_[p] = reinterpret_cast<Board*>(base[l]);
    if (l == lrank) continue;
    from_[p] = reinterpret_cast<Fifo*>(base[lrank] + sizeof(Board) + l * stride);
    to_[p] = reinterpret_cast<Fifo*>(base[l] + sizeof(Board) + lrank * stride);
    ++local_peers_;
  }
  // Fault the FIFOs in now: a first touch costs ~1 us per 4 KiB page on each side (tmpfs allocates on write,
  // every process maps on first access), which would otherwise land on the first laps through each FIFO. The
  // sender writes its outgoing FIFOs (allocating them), then the receiver reads its incoming ones. Up to 16 local
  // ranks; beyond, FIFOs fault in as they are used (they are many, and most pairs never talk).
  if (lsize <= 16) {
    for (Fifo* f : to_)
      if (f) std::memset(static_cast<void*>(f->slots()), 0, kSlots * sizeof(Record) + fifo_bytes_);
    MPI_Barrier(local);
    volatile char sink = 0;
    for (Fifo* f : from_)
      if (f)
        for (size_t at = 0; at < fifo_bytes_; at += 4096) sink = sink + f->data()[at];
  }
  MPI_Comm_free(&local);
}

ShmTransport::~ShmTransport() {
  {
    std::lock_guard<std::mutex> lock(mapped_mutex);
    for (void* m : maps_)
      mapped_segments.erase(std::remove(mapped_segments.begin(), mapped_segments.end(), std::make_pair(m, map_bytes_)),
                            mapped_segments.end());
  }
  for (void* m : maps_) munmap(m, map_bytes_);
}

bool ShmTransport::push(Outgoing& m) {
  Fifo* f = to_[m.peer];
  Peer& me = peers_[m.peer];
  // The consumer's counters are read only when what we last saw does not leave room (they live on its core).
  if (!m.header_done) {
    if (me.sent - me.slots_seen >= kSlots) {
      me.slots_seen = f->slots_done.load(std::memory_order_acquire);
      if (me.sent - me.slots_seen >= kSlots) return false;
    }
    Record& rec = f->slots()[me.sent % kSlots];
    rec.bytes = m.bytes;
    rec.tag = m.tag;
    rec.by_reference = m.by_reference;
    if (m.by_reference) {
      const Reference ref{m.owner, m.segment, m.at};
      std::memcpy(rec.payload, &ref, sizeof ref);
      m.done = m.bytes;
    } else if (m.bytes <= kInline) {
      std::memcpy(rec.payload, m.buf, m.bytes);
      m.done = m.bytes;
    }
    m.record = ++me.sent;
    __atomic_store_n(&rec.seq, m.record, __ATOMIC_RELEASE);
    m.header_done = true;
    if (m.done == m.bytes) return true;
  }
  uint64_t head = f->head.load(std::memory_order_relaxed);
  size_t free = fifo_bytes_ - (head - me.tail_seen);
  if (free < std::min<size_t>(m.bytes - m.done, fifo_bytes_)) {
    me.tail_seen = f->tail.load(std::memory_order_acquire);
    free = fifo_bytes_ - (head - me.tail_seen);
  }
  const size_t n = std::min(m.bytes - m.done, free);  // free is a multiple of 64, so a partial piece is too
  if (n == 0) return false;
  copy_in(f->data(), fifo_bytes_, head, m.buf + m.done, n);
  m.done += n;
  head += m.done == m.bytes ? round_up(n, kLine) : n;
  f->head.store(head, std::memory_order_release);
  return m.done == m.bytes;
}

bool ShmTransport::push_pending() {
  // In order per peer; a peer whose FIFO is full does not hold up the others.
  uint64_t blocked_lo = 0, blocked_hi = 0;  // peers seen blocked in this pass (a bitmap for the first 128)
  std::vector<int> blocked;
  auto is_blocked = [&](int p) {
    if (p < 64) return (blocked_lo >> p) & 1;
    if (p < 128) return (blocked_hi >> (p - 64)) & 1;
    return static_cast<uint64_t>(std::find(blocked.begin(), blocked.end(), p) != blocked.end());
  };
  for (auto it = pending_.begin(); it != pending_.end();) {
    if (!is_blocked(it->peer) && push(*it)) {
      pushed(*it);
      it = pending_.erase(it);
      continue;
    }
    const int p = it->peer;
    if (p < 64)
      blocked_lo |= uint64_t{1} << p;
    else if (p < 128)
      blocked_hi |= uint64_t{1} << (p - 64);
    else
      blocked.push_back(p);
    ++it;
  }
  return !pending_.empty();
}

template <typename Ready>
void ShmTransport::wait_until(Ready ready) {
  auto step = [&] {
    push_pending();
    if (remote_in_flight_) remote_->progress();
    return ready();
  };
  if (step()) return;
  WaitCounters& counters = wait_counters;
  count(counters.waits);
  const int64_t start = now_ns();
  struct CountTime {  // every way out of the wait counts its time
    WaitCounters& counters;
    int64_t start;
    ~CountTime() { count(counters.wait_ns, static_cast<uint64_t>(now_ns() - start)); }
  } count_time{counters, start};
  if (poll_.spin_us < 0) {
    for (uint64_t polls = 1;; ++polls) {
      _mm_pause();
      if (step()) return count(counters.spin_polls, polls);
    }
  }
  // A short pure spin catches a peer that is running on another core right now; after that every poll yields
  // the core, so a peer that shares it (more ranks or threads than cores) runs at once instead of after our spin.
  // One PAUSE between polls (on Zen it lasts ~65 cycles; more would delay seeing a message by a fraction of a us).
  const int64_t spin_until = start + int64_t{poll_.spin_us} * 1000;
  uint64_t polls = 0;
  for (int64_t t = start; t < start + kPureSpinNs && t < spin_until; t = now_ns())
    for (int i = 0; i < 32; ++i) {
      _mm_pause();
      ++polls;
      if (step()) return count(counters.spin_polls, polls);
    }
  count(counters.spin_polls, polls);
  for (int64_t t = now_ns(); t < spin_until; t = now_ns()) {
    sched_yield();
    count(counters.yield_polls);
    if (step()) return;
  }
  int64_t nap = 1000;
  for (;;) {
    const timespec ts{0, static_cast<long>(nap)};
    const int64_t asleep = now_ns();
    nanosleep(&ts, nullptr);
    count(counters.sleeps);
    count(counters.sleep_ns, static_cast<uint64_t>(now_ns() - asleep));
    if (step()) return;
    nap = std::min<int64_t>(2 * nap, int64_t{poll_.max_sleep_us} * 1000);
  }
}

void ShmTransport::send(int peer, const void* buf, size_t bytes, int tag) {
  if (peer < 0 || peer >= size_ || !to_[peer]) {
    remote_->send(peer, buf, bytes, tag);  // also reports a peer outside the communicator
    started_.push_back({false, false});
    ++remote_in_flight_;
    return;
  }
  const uint64_t seq = started_base_ + started_.size();
  started_.push_back({true, false, peer, 0});
  Outgoing m{peer, static_cast<const char*>(buf), bytes, 0, tag, false, seq, false, 0, 0, 0};
  Reference ref;
  if (bytes > kInline && find_reference(buf, bytes, process_of_[peer], ref)) {
    m.by_reference = true;
    m.owner = ref.owner, m.segment = ref.segment, m.at = ref.at;
  }
  count(m.by_reference ? sent_by_reference : sent_copied);
  const bool queued_for_peer =
      std::any_of(pending_.begin(), pending_.end(), [&](const Outgoing& o) { return o.peer == peer; });
  if (!queued_for_peer && push(m))
    pushed(m);
  else
    pending_.push_back(m);
}

void ShmTransport::pushed(const Outgoing& m) {
  Started& s = started_[m.seq - started_base_];
  s.complete = true;
  if (m.by_reference) s.acked_by = m.record;
}

// A copied message is done once in the FIFO; one sent by reference once the peer has read it: the receiver
// publishes slots_done = the record's number after its consumer returned (counters only grow, records are read in
// order).
bool ShmTransport::done(Started& s) {
  if (!s.complete) return false;
  if (s.acked_by && to_[s.peer]->slots_done.load(std::memory_order_acquire) < s.acked_by) return false;
  s.acked_by = 0;
  return true;
}

void ShmTransport::recv_consume(int peer, size_t bytes, int tag, void* staging, const Consume& consume) {
  if (peer < 0 || peer >= size_ || !from_[peer]) return remote_->recv_consume(peer, bytes, tag, staging, consume);
  const watchdog::Wait wait("recv from", peer, tag);
  Fifo* f = from_[peer];
  Peer& me = peers_[peer];
  const uint64_t seq = me.received + 1;
  const Record& rec = f->slots()[me.received % kSlots];
  wait_until([&] { return __atomic_load_n(&rec.seq, __ATOMIC_ACQUIRE) == seq; });
  if (rec.tag != tag) {
    pending_.clear();  // this transport is done for (see TagMismatch); nothing may touch the caller's buffers now
    throw TagMismatch(rank_, peer, tag, rec.tag);
  }
  if (rec.bytes != bytes) {
    pending_.clear();
    throw std::runtime_error("rank " + std::to_string(rank_) + ": ShmTransport::recv from rank " +
                             std::to_string(peer) + " (tag " + std::to_string(tag) + ") expected " +
                             std::to_string(bytes) + " bytes, got " + std::to_string(rec.bytes));
  }
  me.received = seq;
  if (rec.by_reference) {
    Reference ref;
    std::memcpy(&ref, rec.payload, sizeof ref);
    const char* data = resolve(ref, bytes);
    if (!data) {
      pending_.clear();
      throw std::runtime_error("rank " + std::to_string(rank_) + ": ShmTransport::recv from rank " +
                               std::to_string(peer) + " (tag " + std::to_string(tag) +
                               "): the message lies in a registered buffer this rank does not map (freed here?)");
    }
    if (bytes) consume(data, 0, bytes);
    f->slots_done.store(seq, std::memory_order_release);  // the acknowledgement: the sender may reuse its buffer
    return;
  }
  if (bytes <= kInline) {
    if (bytes) consume(rec.payload, 0, bytes);
    f->slots_done.store(seq, std::memory_order_release);  // after consume: the slot may be reused then
    return;
  }
  f->slots_done.store(seq, std::memory_order_release);
  uint64_t tail = f->tail.load(std::memory_order_relaxed), head = 0;
  auto available = [&] { return (head = f->head.load(std::memory_order_acquire)) - tail; };
  for (size_t done = 0; done < bytes;) {
    if (available() == 0) wait_until([&] { return available() > 0; });
    const size_t n = std::min({static_cast<size_t>(head - tail), bytes - done, kPiece});
    const size_t at = tail % fifo_bytes_, first = std::min(n, fifo_bytes_ - at);
    consume(f->data() + at, done, first);
    if (n > first) consume(f->data(), done + first, n - first);
    done += n;
    tail += done == bytes ? round_up(n, kLine) : n;
    f->tail.store(tail, std::memory_order_release);
  }
}

void ShmTransport::recv(int peer, void* buf, size_t bytes, int tag) {
  char* dst = static_cast<char*>(buf);
  recv_consume(peer, bytes, tag, buf,
               [dst](const void* piece, size_t offset, size_t n) { std::memcpy(dst + offset, piece, n); });
}

void ShmTransport::wait_sends(size_t keep_last) {
  const watchdog::Wait wait("completion of sends");
  while (started_.size() > keep_last) {
    Started& oldest = started_.front();
    if (oldest.shm) {
      wait_until([&] { return done(oldest); });
    } else {
      remote_->wait_sends(remote_in_flight_ - 1);  // remote sends retire in order too
      --remote_in_flight_;
    }
    started_.pop_front();
    ++started_base_;
  }
}

// sysfs, not glibc: sysconf(_SC_LEVEL3_CACHE_SIZE) said 320 MiB on a 32 MiB Zen 4 guest.
size_t last_level_cache_bytes() {
  static const size_t bytes = [] {
    size_t largest = 0;
    for (int index = 0; index < 8; ++index) {
      std::ifstream f("/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(index) + "/size");
      size_t kib = 0;
      char unit = 0;
      if (f >> kib >> unit && unit == 'K') largest = std::max(largest, kib << 10);
    }
    return largest ? largest : size_t{32} << 20;
  }();
  return bytes;
}

namespace {

// dst[0, m) = src[0, m) with non-temporal stores (SSE's, on any x86-64: memory bounds them, not the width) where dst
// is 16-byte aligned, the ends ordinarily. The caller fences (_mm_sfence) before anyone may read dst.
void stream_copy(float* dst, const float* src, size_t m) {
  size_t i = 0;
  for (; i < m && reinterpret_cast<uintptr_t>(dst + i) % 16 != 0; ++i) dst[i] = src[i];
  for (; i + 4 <= m; i += 4) _mm_stream_ps(dst + i, _mm_loadu_ps(src + i));
  for (; i < m; ++i) dst[i] = src[i];
}

// outs[k][i] = scale x (((ins[0][i] + ins[1][i]) + ins[2][i]) + ...) for every output k and i in [begin, end): one
// rank's sum, in the order given, goes to every output. One input (the all-gather) is copied as it is: scale and
// check apply to sums only. Block by block: the block's sum is formed once, in L1, then copied into each output, with
// non-temporal stores when `stream` (fenced before it returns). Returns how many blocks had a non-finite sum (counted
// only when `check`).
uint64_t sum_into_all(const std::vector<const float*>& ins, const std::vector<float*>& outs, size_t begin, size_t end,
                      float scale, bool check, bool stream) {
  constexpr size_t kBlock = 1024;  // 4 KiB
  alignas(64) float sum[kBlock];
  uint64_t nonfinite = 0;
  for (size_t at = begin; at < end; at += kBlock) {
    const size_t m = std::min(kBlock, end - at);
    const float* block = ins[0] + at;
    if (ins.size() > 1) {
      const float* b = ins[1] + at;
      for (size_t i = 0; i < m; ++i) sum[i] = block[i] + b[i];
      for (size_t k = 2; k < ins.size(); ++k) {
        const float* c = ins[k] + at;
        for (size_t i = 0; i < m; ++i) sum[i] += c[i];
      }
      if (scale != 1.0f)
        for (size_t i = 0; i < m; ++i) sum[i] *= scale;
      if (check && !cpu::all_finite(sum, static_cast<int64_t>(m))) ++nonfinite;
      block = sum;
    }
    for (float* out : outs)
      if (stream)
        stream_copy(out + at, block, m);
      else
        std::memcpy(out + at, block, m * sizeof(float));
  }
  if (stream) _mm_sfence();
  return nonfinite;
}

const char* name_of(ShmTransport::Direct kind) {
  switch (kind) {
    case ShmTransport::Direct::kAllreduce:
      return "all-reduce";
    case ShmTransport::Direct::kReduceScatter:
      return "reduce-scatter";
    case ShmTransport::Direct::kAllGather:
      return "all-gather";
  }
  return "?";
}

}  // namespace

std::optional<bool> ShmTransport::direct_collective(Direct kind, const float* in, float* out, size_t count,
                                                    const RingOptions& options) {
  const int tag = options.tag;
  if (local_peers_ != size_ - 1 || size_ < 2 || options.wire16)
    throw std::logic_error("ShmTransport::direct_collective: needs 2+ ranks, all on this host, and the fp32 wire");
  const uint64_t call = ++direct_calls_;
  const size_t bytes = count * sizeof(float);
  // Arrive: say what this rank runs, and where its buffers lie if every host peer maps them. (The ring's cut, which
  // decides the chunks each rank owns, comes from settings that every rank shares: check_same_on_every_rank.)
  Reference in_ref{}, out_ref{};
  bool registered = bytes > 0;
  for (int p = 0; p < size_ && registered; ++p)
    registered = p == rank_ || (find_reference(in, bytes, process_of_[p], in_ref) &&
                                find_reference(out, bytes, process_of_[p], out_ref));
  Board::Arrival& mine = boards_[rank_]->arrival;
  mine.count = count;
  mine.tag = tag;
  mine.kind = static_cast<int32_t>(kind);
  mine.registered = registered;
  mine.in_segment = in_ref.segment, mine.in_at = in_ref.at;
  mine.out_segment = out_ref.segment, mine.out_at = out_ref.at;
  __atomic_store_n(&mine.call, call, __ATOMIC_RELEASE);

  // Wait for every peer's arrival, from the predecessor on, so that a mismatch is named as the ring names it. A
  // peer is at most one call behind: it posts call k + 1 only after every rank departed from call k, this one
  // included. A message from a peer means that it runs another collective (the orders differ): named at once too.
  std::vector<const float*>& ins = direct_ins_;  // kept between calls: no allocation per bucket
  std::vector<float*>& outs = direct_outs_;
  ins.assign(size_, nullptr), outs.assign(size_, nullptr);
  bool everyone_registered = registered;
  int unmapped = -1;  // a peer whose buffers this rank cannot find in its mappings
  for (int back = 1; back <= size_; ++back) {
    const int p = (rank_ - back + size_) % size_;
    const Board::Arrival& theirs = boards_[p]->arrival;
    int sender = -1;  // of a message waiting for this rank
    {
      const watchdog::Wait wait("direct collective: the arrival of", p, tag);
      wait_until([&] {
        if (__atomic_load_n(&theirs.call, __ATOMIC_ACQUIRE) == call) return true;
        for (int q = 0; q < size_ && sender < 0; ++q)
          if (from_[q] && __atomic_load_n(&from_[q]->slots()[peers_[q].received % kSlots].seq, __ATOMIC_ACQUIRE) ==
                              peers_[q].received + 1)
            sender = q;
        return sender >= 0;
      });
    }
    if (sender >= 0) {
      pending_.clear();  // as on any mismatch: this transport is done for
      throw TagMismatch(rank_, sender, tag, from_[sender]->slots()[peers_[sender].received % kSlots].tag);
    }
    if (theirs.tag != tag) throw TagMismatch(rank_, p, tag, theirs.tag);
    if (theirs.kind != mine.kind)
      throw std::runtime_error("rank " + std::to_string(rank_) + ": collective mismatch on tag " + std::to_string(tag) +
                               ": this rank runs " + name_of(kind) + ", rank " + std::to_string(p) + " runs " +
                               name_of(static_cast<Direct>(theirs.kind)));
    if (theirs.count != count)
      throw std::runtime_error("rank " + std::to_string(rank_) + ": " + name_of(kind) + " size mismatch on tag " +
                               std::to_string(tag) + ": this rank has " + std::to_string(count) + " elements, rank " +
                               std::to_string(p) + " has " + std::to_string(theirs.count));
    everyone_registered = everyone_registered && theirs.registered;
    if (!everyone_registered) continue;
    if (p == rank_) {
      ins[p] = in, outs[p] = out;
      continue;
    }
    ins[p] = reinterpret_cast<const float*>(resolve({process_of_[p], theirs.in_segment, theirs.in_at}, bytes));
    outs[p] = reinterpret_cast<float*>(resolve({process_of_[p], theirs.out_segment, theirs.out_at}, bytes));
    if ((!ins[p] || !outs[p]) && unmapped < 0) unmapped = p;
  }
  // Every rank saw the same arrivals, so all agree whether to go on (else all run the ring instead). This rank works
  // on the chunks the ring would have it own. Sums go in the ring's order: chunk r+1 of each round starts at rank r+1
  // and ends with this rank's addend (RingRound). So the result is the ring's, bit for bit.
  uint64_t nonfinite = 0;
  if (everyone_registered && unmapped < 0) {
    std::vector<const float*>& sources = direct_sources_;
    std::vector<float*>& targets = direct_targets_;
    sources.clear(), targets.clear();
    if (kind == Direct::kAllGather) {
      sources.push_back(in);
      for (int p = 0; p < size_; ++p)
        if (p != rank_) targets.push_back(outs[p]);
    } else {
      for (int j = 1; j <= size_; ++j) sources.push_back(ins[(rank_ + j) % size_]);
      if (kind == Direct::kAllreduce)
        targets = outs;
      else
        targets.push_back(out);
    }
    // Out of place, once every rank's output together outgrows the last-level cache, the sums go to memory with
    // non-temporal stores: no line of an output is read before it is overwritten (on Zen 4 out of place at 16-256
    // MiB: +48% to +106%; at 4 MiB, where the outputs stay in the cache, they lose: docs/COMM.md, "The direct
    // all-reduce").
    // In place the lines were just read, and an ordinary store hits them in the cache.
    const bool stream = in != out && bytes * static_cast<size_t>(size_) >= last_level_cache_bytes();
    for (const RingChunk& c : ring_owned_chunks(count, size_, rank_, options))
      nonfinite += sum_into_all(sources, targets, c.offset, c.offset + c.count, options.final_scale,
                                options.check_finite, stream);
    direct_collectives.fetch_add(1, std::memory_order_relaxed);
    if (stream) streamed_collectives.fetch_add(1, std::memory_order_relaxed);
  }
  // Depart, and wait until every rank has: then no one reads or writes this rank's buffers any more, and its output
  // holds every chunk it is to receive. A rank that could not map a peer's buffers departs too, so that every rank
  // throws.
  Board::Departure& gone = boards_[rank_]->departure;
  gone.nonfinite = nonfinite;
  gone.unmapped = static_cast<uint64_t>(unmapped + 1);
  __atomic_store_n(&gone.call, call, __ATOMIC_RELEASE);
  std::string failure;
  for (int p = 0; p < size_; ++p) {
    const Board::Departure& theirs = boards_[p]->departure;
    {
      const watchdog::Wait wait("direct collective: the departure of", p, tag);
      wait_until([&] { return __atomic_load_n(&theirs.call, __ATOMIC_ACQUIRE) >= call; });
    }
    if (kind == Direct::kAllreduce && p != rank_) nonfinite += theirs.nonfinite;  // their sums are in our output too
    if (theirs.unmapped && failure.empty())
      failure = "rank " + std::to_string(rank_) + ": direct " + name_of(kind) + ": rank " + std::to_string(p) +
                " does not map the registered segment of rank " + std::to_string(theirs.unmapped - 1) +
                "'s buffers (freed there?)";
  }
  if (!failure.empty()) throw std::runtime_error(failure);
  if (!everyone_registered) return std::nullopt;
  return nonfinite == 0;
}

bool ShmTransport::progress() {
  const bool shm_pending = push_pending();
  const bool remote_pending = remote_in_flight_ ? remote_->progress() : false;
  return shm_pending || remote_pending;
}

}  // namespace ddplab
