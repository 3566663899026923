#include "comm/transport.h"

#include <algorithm>
#include <climits>
#include <stdexcept>
#include <string>

#include "comm/mpi_check.h"

namespace ddplab {

namespace {

// One tag: the duplicate communicator is private and MPI keeps messages between a pair in order, which is all
// the algorithms above rely on.
constexpr int kTag = 0;

}  // namespace

MpiTransport::MpiTransport(MPI_Comm comm, size_t max_message_bytes) : max_message_bytes_(max_message_bytes) {
  if (max_message_bytes == 0 || max_message_bytes > static_cast<size_t>(INT_MAX))
    throw std::invalid_argument("MpiTransport: max_message_bytes must be in [1, INT_MAX], got " +
                                std::to_string(max_message_bytes));
  mpiCheck(MPI_Comm_dup(comm, &comm_));
  // Errors on our own communicator come back as codes (and so as exceptions) instead of aborting the job.
  mpiCheck(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
  mpiCheck(MPI_Comm_rank(comm_, &rank_));
  mpiCheck(MPI_Comm_size(comm_, &size_));
}

MpiTransport::~MpiTransport() {
  // Destructors must not throw, and after MPI_Finalize nothing may be called. Sends still pending here only
  // happen when an exception unwound through an algorithm; waiting for them could hang, so they are left to MPI.
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

void MpiTransport::send(int peer, const void* buf, size_t bytes) {
  // Always at least one message, so an empty send still pairs with an empty recv.
  const char* p = static_cast<const char*>(buf);
  size_t offset = 0;
  do {
    const int piece = static_cast<int>(std::min(bytes - offset, max_message_bytes_));
    MPI_Request request;
    mpiCheck(MPI_Isend(p + offset, piece, MPI_BYTE, peer, kTag, comm_, &request));
    pending_sends_.push_back(request);
    offset += piece;
  } while (offset < bytes);
}

void MpiTransport::recv(int peer, void* buf, size_t bytes) {
  char* p = static_cast<char*>(buf);
  size_t offset = 0;
  do {
    const int piece = static_cast<int>(std::min(bytes - offset, max_message_bytes_));
    MPI_Status status;
    mpiCheck(MPI_Recv(p + offset, piece, MPI_BYTE, peer, kTag, comm_, &status));
    // A shorter message means the peer's algorithm disagrees with ours about sizes: fail loudly, not silently.
    int received = 0;
    mpiCheck(MPI_Get_count(&status, MPI_BYTE, &received));
    if (received != piece)
      throw std::runtime_error("rank " + std::to_string(rank_) + ": MpiTransport::recv from rank " +
                               std::to_string(peer) + " expected " + std::to_string(piece) + " bytes, got " +
                               std::to_string(received));
    offset += piece;
  } while (offset < bytes);
}

void MpiTransport::wait_sends() {
  if (pending_sends_.empty()) return;
  const int err = MPI_Waitall(static_cast<int>(pending_sends_.size()), pending_sends_.data(), MPI_STATUSES_IGNORE);
  // Forget the requests even on failure: they must not be waited on again.
  pending_sends_.clear();
  if (err != MPI_SUCCESS) comm_detail::throw_mpi_error(err, "MPI_Waitall", __FILE__, __LINE__);
}

}  // namespace ddplab
