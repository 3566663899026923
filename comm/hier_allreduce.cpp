#include "comm/hier_allreduce.h"

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "comm/mpi_check.h"

namespace ddplab {

namespace {

// The group of comm's ranks with the same color, over the transport its topology calls for (within a node shared
// memory, across nodes MPI), wrapped as the caller asks. `ids`: the group's node of each rank of comm (by rank).
std::unique_ptr<Transport> split_transport(MPI_Comm comm, int color, int key, const std::vector<int>& ids,
                                           const HierAllreduce::WrapTransport& wrap, std::string& name) {
  int n = 1;
  mpiCheck(MPI_Comm_size(comm, &n));
  std::vector<int> colors(n), group_ids;
  mpiCheck(MPI_Allgather(&color, 1, MPI_INT, colors.data(), 1, MPI_INT, comm));
  for (int r = 0; r < n; ++r)  // the group keeps comm's order (key = rank)
    if (colors[r] == color) group_ids.push_back(ids[r]);
  const Topology group = topology_from_ids(group_ids);
  MPI_Comm group_comm;
  mpiCheck(MPI_Comm_split(comm, color, key, &group_comm));
  std::unique_ptr<Transport> t = connect_transport(group_comm, group, RingOptions{}, name);  // FIFOs: default size
  mpiCheck(MPI_Comm_free(&group_comm));
  name = describe_hops(group, *t, /*say_where=*/true);
  return wrap ? wrap(std::move(t), group) : std::move(t);
}

}  // namespace

// The all-reduces across nodes, on a thread of their own over the group's transport, in the order started. One
// thread uses the group's transport, so the Transport contract (one caller at a time) holds.
class HierAllreduce::CrossNodeWorker {
 public:
  explicit CrossNodeWorker(std::unique_ptr<Transport> group) : group_(std::move(group)) {}
  ~CrossNodeWorker() {
    if (!thread_.joinable()) return;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    work_cv_.notify_one();
    thread_.join();
  }

  Transport& group() { return *group_; }
  const Transport& group() const { return *group_; }

  // On the calling thread (one node per rank, or nothing to pipeline).
  void allreduce_now(const float* in, float* out, size_t count, const RingOptions& options) {
    ring_allreduce_sum(in, out, count, *group_, scratch_, options);
  }
  // Hands data[0, count) to the worker: summed in place across the nodes.
  void start(float* data, size_t count, const RingOptions& options) {
    if (!thread_.joinable()) thread_ = std::thread([this] { loop(); });
    {
      std::lock_guard<std::mutex> lock(mutex_);
      jobs_.push_back({data, count, options});
    }
    work_cv_.notify_one();
  }
  // Blocks until the oldest started job is done; rethrows what it threw.
  void wait_oldest() {
    std::unique_lock<std::mutex> lock(mutex_);
    done_cv_.wait(lock, [&] { return finished_ > waited_ || error_; });
    if (error_) std::rethrow_exception(error_);
    ++waited_;
  }
  bool idle() {
    std::lock_guard<std::mutex> lock(mutex_);
    return jobs_.empty() && !busy_;
  }
  // Lets the thread run on, never to be joined (see ~HierAllreduce); this object is not freed.
  void abandon() {
    if (thread_.joinable()) thread_.detach();
  }

 private:
  struct Job {
    float* data;
    size_t count;
    RingOptions options;
  };
  void loop() {
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      work_cv_.wait(lock, [&] { return stop_ || !jobs_.empty(); });
      if (jobs_.empty()) return;  // stop_, nothing left
      const Job job = jobs_.front();
      jobs_.pop_front();
      busy_ = true;
      lock.unlock();
      std::exception_ptr error;
      try {
        ring_allreduce_sum(job.data, job.data, job.count, *group_, scratch_, job.options);
      } catch (...) {
        error = std::current_exception();
      }
      lock.lock();
      busy_ = false;
      ++finished_;
      if (error) {
        error_ = error;
        jobs_.clear();  // the group's transport is in an unknown state: nothing more goes over it
      }
      done_cv_.notify_all();
    }
  }

  std::unique_ptr<Transport> group_;
  RingScratch scratch_;
  std::thread thread_;
  std::mutex mutex_;
  std::condition_variable work_cv_, done_cv_;
  std::deque<Job> jobs_;
  uint64_t finished_ = 0, waited_ = 0;
  bool busy_ = false, stop_ = false;
  std::exception_ptr error_;
};

HierAllreduce::HierAllreduce(MPI_Comm comm, int node, const WrapTransport& wrap) {
  int rank = 0, n = 1;
  mpiCheck(MPI_Comm_rank(comm, &rank));
  mpiCheck(MPI_Comm_size(comm, &n));
  std::vector<int> node_of(n);
  mpiCheck(MPI_Allgather(&node, 1, MPI_INT, node_of.data(), 1, MPI_INT, comm));
  const std::vector<int> sizes = topology_from_ids(node_of).node_sizes();  // nodes in the order of their first rank
  if (std::count(sizes.begin(), sizes.end(), sizes[0]) != static_cast<long>(sizes.size())) {
    std::string list;
    for (int s : sizes) list += (list.empty() ? "" : ", ") + std::to_string(s);
    throw std::invalid_argument("hierarchical all-reduce needs the same number of ranks on every node; the " +
                                std::to_string(sizes.size()) + " nodes have " + list + " ranks");
  }
  std::string intra_name, inter_name;
  intra_ = split_transport(comm, node, rank, node_of, wrap, intra_name);
  cross_ = std::make_unique<CrossNodeWorker>(split_transport(comm, intra_->rank(), rank, node_of, wrap, inter_name));
  const bool both = local_size() > 1 && nodes() > 1;
  transport_name_ = both ? intra_name + " + " + inter_name : local_size() > 1 ? intra_name : inter_name;
}

HierAllreduce::~HierAllreduce() {
  // A worker still inside a cross-node all-reduce (an error unwound this thread mid-pipeline) may wait on a peer
  // that is gone: leave it and what it touches allocated rather than join it; the program's edge aborts MPI.
  if (cross_ && !cross_->idle()) {
    cross_.release()->abandon();
    intra_.release();
  }
}

int HierAllreduce::nodes() const { return cross_->group().size(); }

void HierAllreduce::allreduce_sum(const float* in, float* out, size_t count, const RingOptions& options) {
  const int local = local_size();
  if (local == 1 || count == 0) return cross_->allreduce_now(in, out, count, options);
  // Round by round, as the flat ring goes (same plan, over the node): each round's owned chunk is this rank's
  // shard, all-reduced across the nodes between the two halves. Round i's shard crosses the nodes on the worker
  // while this thread reduce-scatters round i+1 and all-gathers round i-1: the rounds touch disjoint parts of
  // out, and each half ends with every send retired (ring_allreduce.h), so the halves of different rounds may
  // follow one another on the node's transport. Every rank runs the same sequence, so messages still pair up.
  const RingPlan plan = plan_ring(count, local, options);
  RingPrimitives prims(*intra_, in, out, intra_scratch_, plan.max_chunk, plan.slices, options);
  std::deque<RingRound> crossing;  // rounds whose shard is with the worker, oldest first
  for (size_t begin = 0; begin < count; begin += plan.round) {
    const RingRound round{begin, std::min(plan.round, count - begin), local, local_rank()};
    ring_reduce_scatter<RingSeam::kApart>(prims, round);
    const RingChunk shard = round.owned();
    cross_->start(out + shard.offset, shard.count, options);
    crossing.push_back(round);
    if (crossing.size() == 2) {  // the previous round's shard is (nearly) back: gather it while this one crosses
      cross_->wait_oldest();
      ring_all_gather<RingSeam::kApart>(prims, crossing.front());
      crossing.pop_front();
    }
  }
  for (; !crossing.empty(); crossing.pop_front()) {
    cross_->wait_oldest();
    ring_all_gather<RingSeam::kApart>(prims, crossing.front());
  }
}

}  // namespace ddplab
