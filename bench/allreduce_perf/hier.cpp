// hier: the hierarchical all-reduce (comm/hier_allreduce.h): ring in the node, ring across nodes per shard, ring in
// the node. The nodes are the hosts, or emulated: --ranks-per-node K puts rank r on node r / K.
#include "bench/allreduce_perf/impl.h"

namespace ddplab::perf {

std::vector<Impl> make_hier(const ImplContext& c) {
  const Options& o = c.options;
  return communicator_impl(c, {AllreduceImpl::kHier, WireDtype::kFp32, o.link, o.ranks_per_node});
}

}  // namespace ddplab::perf
