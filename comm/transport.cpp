#include "comm/transport.h"

#include <sched.h>
#include <sys/prctl.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdlib>
#include <ctime>
#include <string>
#include <thread>
#include <vector>

#include "runtime/mpi_check.h"
#include "runtime/settings.h"
#include "runtime/watchdog.h"

namespace ddplab {

TagMismatch::TagMismatch(int rank_, int peer_, int expected_tag_, int received_tag_)
    : std::runtime_error("rank " + std::to_string(rank_) + ": the next message from rank " + std::to_string(peer_) +
                         " carries tag " + std::to_string(received_tag_) + ", expected tag " +
                         std::to_string(expected_tag_)),
      rank(rank_),
      peer(peer_),
      expected_tag(expected_tag_),
      received_tag(received_tag_) {}

void Transport::recv_consume(int peer, size_t bytes, int tag, void* staging, const Consume& consume) {
  recv(peer, staging, bytes, tag);
  consume(staging, 0, bytes);
}

void tighten_timer_slack_once() {
  thread_local bool done = false;
  if (!done) {
    prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);
    done = true;
  }
}

PollPolicy PollPolicy::from_env() {
  static const PollPolicy policy = [] {
    PollPolicy p;
    p.spin_us = static_cast<int>(settings::integer(settings::kCommSpinUs));
    p.max_sleep_us = static_cast<int>(settings::integer(settings::kCommMaxSleepUs));
    return p;
  }();
  return policy;
}

double measure_lost_yield_ms(MPI_Comm comm, int compute_threads, int samples) {
  // A yield that returns after this lost the core: no time slice is shorter, and one that finds no other thread to
  // run returns in a few us.
  constexpr double kLostMs = 0.25;
  mpiCheck(MPI_Barrier(comm));
  std::atomic<bool> yielded{false}, everyone{false};
  double lost[2] = {0, 0};  // ms, count
  std::thread yielder([&] {
    for (int i = 0; i < samples; ++i) {
      const timespec nap{0, 100'000};  // as a comm thread between polls; woken, it takes a core from a spinner
      nanosleep(&nap, nullptr);
      const int64_t start = monotonic_ns();
      sched_yield();
      const double ms = static_cast<double>(monotonic_ns() - start) / 1e6;
      if (ms > kLostMs) lost[0] += ms, lost[1] += 1;
    }
    yielded = true;
  });
  const auto spin = [&] {
    while (!everyone.load(std::memory_order_relaxed)) {
    }
  };
  std::vector<std::thread> spinners;
  for (int t = 1; t < compute_threads; ++t) spinners.emplace_back(spin);
  {
    // The main thread spins too, until every rank's yields are done: a rank that stopped early would free a core
    // for the others' yields.
    const watchdog::Wait wait("the start-up probe of the comm thread's yields");
    MPI_Request all_done = MPI_REQUEST_NULL;
    for (int done = 0; !done;) {
      if (all_done == MPI_REQUEST_NULL && yielded.load(std::memory_order_relaxed))
        mpiCheck(MPI_Ibarrier(comm, &all_done));
      if (all_done != MPI_REQUEST_NULL) mpiCheck(MPI_Test(&all_done, &done, MPI_STATUS_IGNORE));
    }
  }
  everyone = true;
  yielder.join();
  for (std::thread& s : spinners) s.join();
  double total[2] = {0, 0};
  mpiCheck(MPI_Allreduce(lost, total, 2, MPI_DOUBLE, MPI_SUM, comm));
  return total[1] > 0 ? total[0] / total[1] : 0;
}

void nap(int64_t ns) {
  const timespec ts{static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
  nanosleep(&ts, nullptr);
}

int poll_wait(MPI_Request* request, MPI_Status* status, const PollPolicy& policy,
              const std::function<void()>& between_polls) {
  int done = 0;
  int err = MPI_Test(request, &done, status);
  if (err != MPI_SUCCESS || done) return err;
  if (policy.spin_us < 0) {
    if (!between_polls) return MPI_Wait(request, status);
    for (;;) {  // spins as MPI_Wait does, with the hook between polls
      between_polls();
      err = MPI_Test(request, &done, status);
      if (err != MPI_SUCCESS || done) return err;
    }
  }
  const int64_t spin_until = monotonic_ns() + int64_t{policy.spin_us} * 1000;
  while (monotonic_ns() < spin_until) {
    if (between_polls) between_polls();
    err = MPI_Test(request, &done, status);
    if (err != MPI_SUCCESS || done) return err;
  }
  tighten_timer_slack_once();
  int64_t sleep_ns = 1000;
  for (;;) {
    nap(sleep_ns);
    if (between_polls) between_polls();
    err = MPI_Test(request, &done, status);
    if (err != MPI_SUCCESS || done) return err;
    sleep_ns = std::min<int64_t>(2 * sleep_ns, int64_t{policy.max_sleep_us} * 1000);
  }
}

MpiTransport::MpiTransport(MPI_Comm comm, size_t max_message_bytes, PollPolicy poll)
    : max_message_bytes_(max_message_bytes), poll_(poll) {
  if (max_message_bytes == 0 || max_message_bytes > static_cast<size_t>(INT_MAX))
    throw std::invalid_argument("MpiTransport: max_message_bytes must be in [1, INT_MAX], got " +
                                std::to_string(max_message_bytes));
  mpiCheck(MPI_Comm_dup(comm, comm_.receive()));
  name_ranks_as_in_world(comm_);
  // Errors on our own communicator come back as codes (and so as exceptions) instead of aborting the job.
  mpiCheck(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
  mpiCheck(MPI_Comm_rank(comm_, &rank_));
  mpiCheck(MPI_Comm_size(comm_, &size_));
  int* ub = nullptr;
  int found = 0;
  mpiCheck(MPI_Comm_get_attr(comm_, MPI_TAG_UB, &ub, &found));
  if (found && ub) tag_ub_ = *ub;
}

void Transport::name_ranks_as_in_world(MPI_Comm comm) {
  int n = 0;
  mpiCheck(MPI_Comm_size(comm, &n));
  MPI_Group group, world;
  mpiCheck(MPI_Comm_group(comm, &group));
  mpiCheck(MPI_Comm_group(MPI_COMM_WORLD, &world));
  std::vector<int> ranks(n);
  for (int r = 0; r < n; ++r) ranks[r] = r;
  world_rank_.assign(n, MPI_UNDEFINED);
  mpiCheck(MPI_Group_translate_ranks(group, n, ranks.data(), world, world_rank_.data()));
  MPI_Group_free(&group);
  MPI_Group_free(&world);
  for (int r = 0; r < n; ++r)
    if (world_rank_[r] == MPI_UNDEFINED) world_rank_[r] = r;  // not a world communicator's: its own numbers
}

void MpiTransport::check_tag(int tag) const {
  if (tag < 0 || tag > tag_ub_)
    throw std::invalid_argument("rank " + std::to_string(named(rank_)) + ": MpiTransport: tag " + std::to_string(tag) +
                                " outside MPI's range [0, " + std::to_string(tag_ub_) + "]");
}

void MpiTransport::send(int peer, const void* buf, size_t bytes, int tag) {
  check_tag(tag);
  // Always at least one message, so an empty send still pairs with an empty recv.
  const char* p = static_cast<const char*>(buf);
  size_t offset = 0;
  do {
    const int piece = static_cast<int>(std::min(bytes - offset, max_message_bytes_));
    MPI_Request request;
    mpiCheck(MPI_Isend(p + offset, piece, MPI_BYTE, peer, tag, comm_, &request));
    pending_sends_.push_back(request);
    offset += piece;
  } while (offset < bytes);
  sends_.push_back({(bytes + max_message_bytes_ - 1) / max_message_bytes_ + (bytes == 0), peer});
}

void MpiTransport::recv(int peer, void* buf, size_t bytes, int tag) {
  check_tag(tag);
  const watchdog::Wait wait("recv from", named(peer), tag);
  char* p = static_cast<char*>(buf);
  size_t offset = 0;
  do {
    const int piece = static_cast<int>(std::min(bytes - offset, max_message_bytes_));
    // Any tag: the message that comes next from peer is received and its tag compared, so a message of another
    // operation is reported as such (not waited for forever, not confused with ours).
    MPI_Request request;
    mpiCheck(MPI_Irecv(p + offset, piece, MPI_BYTE, peer, MPI_ANY_TAG, comm_, &request));
    MPI_Status status;
    status.MPI_TAG = tag;  // stays ours unless MPI matched a message
    int err = MPI_SUCCESS;
    try {
      err = poll_wait(&request, &status, poll_, [this] { waiting(); });
    } catch (...) {  // the hook ended the wait: the caller's buffer may go as the exception unwinds
      MPI_Cancel(&request);
      MPI_Wait(&request, MPI_STATUS_IGNORE);  // on a cancelled request it returns whatever the peer does
      settle_sends_before_throwing();
      throw;
    }
    int err_class = MPI_SUCCESS;
    if (err != MPI_SUCCESS) MPI_Error_class(err, &err_class);
    if ((err == MPI_SUCCESS || err_class == MPI_ERR_TRUNCATE) && status.MPI_TAG != tag) {
      settle_sends_before_throwing();
      throw TagMismatch(named(rank_), named(peer), tag, status.MPI_TAG);
    }
    // A different size means the peer's algorithm disagrees with ours about sizes: fail loudly, not silently.
    const std::string size_error = "rank " + std::to_string(named(rank_)) + ": MpiTransport::recv from rank " +
                                   std::to_string(named(peer)) + " (tag " + std::to_string(tag) + ") expected " +
                                   std::to_string(piece) + " bytes, got ";
    if (err != MPI_SUCCESS) settle_sends_before_throwing();
    if (err_class == MPI_ERR_TRUNCATE) throw std::runtime_error(size_error + "more");
    if (err != MPI_SUCCESS) comm_detail::throw_mpi_error(err, "MPI_Wait", __FILE__, __LINE__);
    int received = 0;
    mpiCheck(MPI_Get_count(&status, MPI_BYTE, &received));
    if (received != piece) {
      settle_sends_before_throwing();
      throw std::runtime_error(size_error + std::to_string(received));
    }
    offset += piece;
  } while (offset < bytes);
}

// An exception unwinds through the algorithm into code that may free the buffers our sends still read (Open MPI
// pushes rendezvous data from the sender's buffer during any later MPI call). In the mismatches every rank
// detects, each pending send has a posted receive and completes at once; otherwise the peer may be gone, so the
// wait is bounded and what is left is released to MPI (the job is about to be aborted in that case anyway).
void MpiTransport::settle_sends_before_throwing() noexcept {
  const int64_t give_up = monotonic_ns() + 2'000'000'000;
  for (MPI_Request& r : pending_sends_) {
    int done = 0;
    while (r != MPI_REQUEST_NULL && MPI_Test(&r, &done, MPI_STATUS_IGNORE) == MPI_SUCCESS && !done &&
           monotonic_ns() < give_up) {
      const timespec ts{0, 100'000};
      nanosleep(&ts, nullptr);
    }
    if (r != MPI_REQUEST_NULL && !done) MPI_Request_free(&r);
  }
  pending_sends_.clear();
  sends_.clear();
}

bool MpiTransport::progress() {
  if (pending_sends_.empty()) return false;
  int done = 0;  // MPI_Testall frees the requests only when all are complete (then so do we); else it leaves them
  mpiCheck(MPI_Testall(static_cast<int>(pending_sends_.size()), pending_sends_.data(), &done, MPI_STATUSES_IGNORE));
  if (done) {
    pending_sends_.clear();
    sends_.clear();
  }
  return !done;
}

void MpiTransport::wait_sends(size_t keep_last) {
  size_t retired = 0;  // requests of the oldest sends, all but the last keep_last sends
  int first_err = MPI_SUCCESS;
  while (sends_.size() > keep_last) {
    const watchdog::Wait wait("completion of a send to", named(sends_.front().peer));
    for (size_t i = 0; i < sends_.front().requests; ++i, ++retired) {
      int err = MPI_SUCCESS;
      try {
        err = poll_wait(&pending_sends_[retired], MPI_STATUS_IGNORE, poll_, [this] { waiting(); });
      } catch (...) {  // the hook ended the wait
        settle_sends_before_throwing();
        throw;
      }
      if (first_err == MPI_SUCCESS) first_err = err;
    }
    sends_.pop_front();
  }
  // Forget the requests even on failure: they must not be waited on again.
  pending_sends_.erase(pending_sends_.begin(), pending_sends_.begin() + static_cast<std::ptrdiff_t>(retired));
  if (first_err != MPI_SUCCESS) comm_detail::throw_mpi_error(first_err, "MPI_Wait", __FILE__, __LINE__);
}

}  // namespace ddplab
