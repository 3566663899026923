// The placements of ranks on nodes the multi-node tests run over (test_hier_allreduce, test_topology).
#pragma once
#include <ostream>
#include <vector>

namespace ddplab {

// Which node each rank is on, as a function of (rank, world size).
struct NodeSplit {
  const char* name;
  int (*node)(int rank, int n);
};
inline const NodeSplit kNodeSplits[] = {
    {"one_node", [](int, int) { return 0; }},
    {"two_per_node", [](int r, int) { return r / 2; }},
    {"one_per_node", [](int r, int) { return r; }},
    {"interleaved", [](int r, int) { return r % 2; }},  // round-robin placement: nodes {0, 2} and {1, 3}
    {"three_plus_one", [](int r, int) { return r < 3 ? 0 : 1; }},
};
inline void PrintTo(const NodeSplit& s, std::ostream* os) { *os << s.name; }

inline std::vector<int> node_ids(const NodeSplit& split, int n) {
  std::vector<int> ids(n);
  for (int r = 0; r < n; ++r) ids[r] = split.node(r, n);
  return ids;
}

}  // namespace ddplab
