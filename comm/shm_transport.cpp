#include "comm/shm_transport.h"

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
#include <stdexcept>
#include <string>
#include <utility>

#include "runtime/mpi_check.h"
#include "runtime/watchdog.h"

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

using shm_detail::Reference;
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

namespace {

static_assert(std::atomic<uint64_t>::is_always_lock_free, "shared-memory counters must be lock-free");

size_t round_up(size_t x, size_t to) { return (x + to - 1) / to * to; }

// Copies n bytes to/from the ring at position pos (mod capacity), wrapping around its end.
void copy_in(char* ring, size_t cap, uint64_t pos, const char* src, size_t n) {
  const size_t at = pos % cap, first = std::min(n, cap - at);
  std::memcpy(ring + at, src, first);
  if (n > first) std::memcpy(ring, src + first, n - first);
}

// ShmWaitStats, as relaxed atomics: transports on several threads (the Reducer's and an extra communicator's)
// may wait at once.
struct WaitCounters {
  std::atomic<uint64_t> waits{0}, spin_polls{0}, yield_polls{0}, sleeps{0}, wait_ns{0}, sleep_ns{0};
};
WaitCounters wait_counters;
std::atomic<uint64_t> sent_by_reference{0}, sent_copied{0};
void count(std::atomic<uint64_t>& counter, uint64_t n = 1) { counter.fetch_add(n, std::memory_order_relaxed); }

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

ShmTransport::ShmTransport(MPI_Comm comm, const std::vector<int>& node_of_rank, size_t fifo_bytes, PollPolicy poll)
    : fifo_bytes_(std::max<size_t>(round_up(fifo_bytes, kLine), 2 * kLine)), poll_(poll) {
  static_assert(sizeof(Fifo) == 3 * kLine, "three cache lines of counters, then the slots");
  mpiCheck(MPI_Comm_rank(comm, &rank_));
  mpiCheck(MPI_Comm_size(comm, &size_));
  name_ranks_as_in_world(comm);
  to_.assign(size_, nullptr);
  from_.assign(size_, nullptr);
  boards_.assign(size_, nullptr);
  peers_.assign(size_, Peer{});
  std::vector<int> world_of;  // per local rank: its rank in comm
  const OwnedComm local = join_local_group(comm, node_of_rank, world_of);
  const size_t stride = sizeof(Fifo) + kSlots * sizeof(Record) + fifo_bytes_;
  lay_out(map_segments(local, stride), world_of, stride);
  fault_in_fifos(local);
}

// The ranks of this host, then of them those on this rank's node (an emulated node may span hosts), with the process
// each runs in.
OwnedComm ShmTransport::join_local_group(MPI_Comm comm, const std::vector<int>& node_of_rank,
                                         std::vector<int>& world_of) {
  OwnedComm host, local;
  mpiCheck(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, host.receive()));
  const int node = node_of_rank.empty() ? 0 : node_of_rank.at(rank_);
  mpiCheck(MPI_Comm_split(host, node, rank_, local.receive()));
  host.reset();
  int lsize = 1;
  MPI_Comm_size(local, &lsize);
  world_of.assign(lsize, 0);
  MPI_Allgather(&rank_, 1, MPI_INT, world_of.data(), 1, MPI_INT, local);
  std::vector<uint64_t> process_of_local(lsize);
  const uint64_t me = shm_detail::this_process();
  MPI_Allgather(&me, 1, MPI_UINT64_T, process_of_local.data(), 1, MPI_UINT64_T, local);
  process_of_.assign(size_, 0);
  for (int l = 0; l < lsize; ++l) process_of_[world_of[l]] = process_of_local[l];
  return local;
}

// Each local rank shares its segment (its board, then its incoming FIFOs) and maps everyone's. Every step that can
// fail is agreed on by all local ranks, so either all use shared memory or all throw. Returns each local rank's
// segment as mapped here.
std::vector<char*> ShmTransport::map_segments(MPI_Comm local, size_t stride) {
  const std::string who = "rank " + std::to_string(named(rank_)) + ": ShmTransport: ";
  int lsize = 1;
  MPI_Comm_size(local, &lsize);
  map_bytes_ = kBoardBytes + stride * lsize;
  const shm_detail::SharedSegments shared(local, "fifos", map_bytes_, who);
  // Allocated now where fault_in_fifos would touch it all anyway (up to 16 local ranks): a /dev/shm too small is
  // then this step's agreed failure (and the fallback to MPI), not a SIGBUS in the first write.
  std::string error = lsize <= kFaultInRanks ? shm_detail::allocate(shared.own().fd, map_bytes_) : "";
  std::vector<char*> base(lsize, nullptr);
  for (int l = 0; l < lsize && error.empty(); ++l) {
    base[l] = static_cast<char*>(shm_detail::map_shared(shared[l].fd, map_bytes_, /*populate=*/false, error));
    if (base[l]) maps_.push_back(base[l]);
  }
  try {
    shm_detail::agree(local, error, who + "mapping the segments");
  } catch (...) {
    for (void* m : maps_) munmap(m, map_bytes_);
    maps_.clear();
    throw;
  }
  for (void* m : maps_) shm_detail::note_mapped(m, map_bytes_);
  return base;
}

// Segment of local rank l holds l's board, then the FIFOs into l, one per local sender (by local rank).
void ShmTransport::lay_out(const std::vector<char*>& base, const std::vector<int>& world_of, size_t stride) {
  const int me = static_cast<int>(std::find(world_of.begin(), world_of.end(), rank_) - world_of.begin());
  for (size_t l = 0; l < world_of.size(); ++l) {
    const int p = world_of[l];
    boards_[p] = base[l];
    if (p == rank_) continue;
    from_[p] = reinterpret_cast<Fifo*>(base[me] + kBoardBytes + l * stride);
    to_[p] = reinterpret_cast<Fifo*>(base[l] + kBoardBytes + me * stride);
    ++local_peers_;
  }
}

// Faults the FIFOs in now: a first touch costs ~1 us per 4 KiB page on each side (tmpfs allocates on write, every
// process maps on first access), which would otherwise land on the first laps through each FIFO. The sender writes
// its outgoing FIFOs, then the receiver reads its incoming ones. Up to kFaultInRanks local ranks; beyond, FIFOs
// fault in as they are used.
void ShmTransport::fault_in_fifos(MPI_Comm local) {
  if (local_peers_ + 1 > kFaultInRanks) return;
  for (Fifo* f : to_)
    if (f) std::memset(static_cast<void*>(f->slots()), 0, kSlots * sizeof(Record) + fifo_bytes_);
  MPI_Barrier(local);
  volatile char sink = 0;
  for (Fifo* f : from_)
    if (f)
      for (size_t at = 0; at < fifo_bytes_; at += 4096) sink = sink + f->data()[at];
}

ShmTransport::~ShmTransport() {
  for (void* m : maps_) shm_detail::forget_mapped(m, map_bytes_);
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
    waiting();
    return ready();
  };
  if (step()) return;
  WaitCounters& counters = wait_counters;
  count(counters.waits);
  const int64_t start = monotonic_ns();
  struct CountTime {  // every way out of the wait counts its time
    WaitCounters& counters;
    int64_t start;
    ~CountTime() { count(counters.wait_ns, static_cast<uint64_t>(monotonic_ns() - start)); }
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
  for (int64_t t = start; t < start + kPureSpinNs && t < spin_until; t = monotonic_ns())
    for (int i = 0; i < 32; ++i) {
      _mm_pause();
      ++polls;
      if (step()) return count(counters.spin_polls, polls);
    }
  count(counters.spin_polls, polls);
  for (int64_t t = monotonic_ns(); t < spin_until; t = monotonic_ns()) {
    sched_yield();
    count(counters.yield_polls);
    if (step()) return;
  }
  int64_t nap_ns = 1000;
  for (;;) {
    const int64_t asleep = monotonic_ns();
    nap(nap_ns);
    count(counters.sleeps);
    count(counters.sleep_ns, static_cast<uint64_t>(monotonic_ns() - asleep));
    if (step()) return;
    nap_ns = std::min<int64_t>(2 * nap_ns, int64_t{poll_.max_sleep_us} * 1000);
  }
}

void ShmTransport::send(int peer, const void* buf, size_t bytes, int tag) {
  if (!through_shm(peer)) throw not_through_shm("send to", peer);
  const uint64_t seq = started_base_ + started_.size();
  started_.push_back({false, peer, 0});
  Outgoing m{peer, static_cast<const char*>(buf), bytes, 0, tag, false, seq, false, 0, 0, 0};
  Reference ref;
  if (bytes > kInline && shm_detail::find_reference(buf, bytes, process_of_[peer], ref)) {
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

void ShmTransport::recv_consume(int peer, size_t bytes, int tag, void* /*staging*/, const Consume& consume) {
  if (!through_shm(peer)) throw not_through_shm("recv from", peer);
  const watchdog::Wait wait("recv from", named(peer), tag);
  Fifo* f = from_[peer];
  Peer& me = peers_[peer];
  const uint64_t seq = me.received + 1;
  const Record& rec = f->slots()[me.received % kSlots];
  wait_until([&] { return __atomic_load_n(&rec.seq, __ATOMIC_ACQUIRE) == seq; });
  if (rec.tag != tag) {
    pending_.clear();  // this transport is done for (see TagMismatch); nothing may touch the caller's buffers now
    throw TagMismatch(named(rank_), named(peer), tag, rec.tag);
  }
  if (rec.bytes != bytes) {
    pending_.clear();
    throw std::runtime_error("rank " + std::to_string(named(rank_)) + ": ShmTransport::recv from rank " +
                             std::to_string(named(peer)) + " (tag " + std::to_string(tag) + ") expected " +
                             std::to_string(bytes) + " bytes, got " + std::to_string(rec.bytes));
  }
  me.received = seq;
  if (rec.by_reference) {
    Reference ref;
    std::memcpy(&ref, rec.payload, sizeof ref);
    const char* data = shm_detail::resolve(ref, bytes);
    if (!data) {
      pending_.clear();
      throw std::runtime_error("rank " + std::to_string(named(rank_)) + ": ShmTransport::recv from rank " +
                               std::to_string(named(peer)) + " (tag " + std::to_string(tag) +
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
  while (started_.size() > keep_last) {
    Started& oldest = started_.front();
    const watchdog::Wait wait("completion of a send to", named(oldest.peer));
    wait_until([&] { return done(oldest); });
    started_.pop_front();
    ++started_base_;
  }
}

bool ShmTransport::progress() { return push_pending(); }

void ShmTransport::wait_for(const std::function<bool()>& ready) { wait_until(ready); }

std::optional<std::pair<int, int>> ShmTransport::message_waiting() const {
  for (int q = 0; q < size_; ++q) {
    if (!from_[q]) continue;
    const Record& next = from_[q]->slots()[peers_[q].received % kSlots];
    if (__atomic_load_n(&next.seq, __ATOMIC_ACQUIRE) == peers_[q].received + 1) return std::make_pair(q, next.tag);
  }
  return std::nullopt;
}

std::logic_error ShmTransport::not_through_shm(const char* what, int peer) const {
  return std::logic_error("rank " + std::to_string(named(rank_)) + ": ShmTransport: " + what + " rank " +
                          std::to_string(named(peer)) +
                          ", which it does not reach (the transport table routes it elsewhere)");
}

}  // namespace ddplab
