#include "runtime/rank_identity.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <map>
#include <type_traits>

namespace ddplab {
namespace {

// What travels. Its layout must never change: ranks of different builds compare through it, and a different size
// would make the all-gather fail instead of naming the builds.
struct WireIdentity {
  char command[64];
  char version[32];
  char commit[64];
  char host[128];
};
static_assert(std::is_trivially_copyable_v<WireIdentity> && sizeof(WireIdentity) == 288);

template <size_t N>
void put(char (&slot)[N], const std::string& text) {
  std::memset(slot, 0, N);
  std::memcpy(slot, text.data(), std::min(text.size(), N - 1));
}

template <size_t N>
std::string take(const char (&slot)[N]) {
  return std::string(slot, strnlen(slot, N));
}

// "rank 3", "ranks 0-2", "ranks 0, 2, 5-7": consecutive ranks as ranges.
std::string list_ranks(const std::vector<int>& ranks) {
  std::string text = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    text += (i ? ", " : "") + std::to_string(ranks[i]);
    if (j > i) text += "-" + std::to_string(ranks[j]);
    i = j + 1;
  }
  return text;
}

// "host a", "hosts a, b": each host once, in rank order; past four, how many more.
std::string list_hosts(const std::vector<std::string>& hosts) {
  constexpr size_t kNamed = 4;
  std::string text = hosts.size() == 1 ? "host " : "hosts ";
  for (size_t i = 0; i < hosts.size() && i < kNamed; ++i) text += (i ? ", " : "") + hosts[i];
  if (hosts.size() > kNamed) text += " and " + std::to_string(hosts.size() - kNamed) + " more";
  return text;
}

// The ranks grouped by `value`, in the order each value first appears: "rank 0 (host a) runs train, ranks 1-3
// (hosts a, b) run suite"; "" when every rank holds the same value.
std::string groups_by(const std::vector<RankIdentity>& ranks,
                      const std::function<std::string(const RankIdentity&)>& value) {
  std::vector<std::string> order;
  std::map<std::string, std::vector<int>> members;
  for (size_t r = 0; r < ranks.size(); ++r) {
    const std::string v = value(ranks[r]);
    if (!members.count(v)) order.push_back(v);
    members[v].push_back(static_cast<int>(r));
  }
  if (order.size() <= 1) return "";
  std::string text;
  for (const std::string& v : order) {
    const std::vector<int>& group = members[v];
    std::vector<std::string> hosts;
    for (const int r : group)
      if (std::find(hosts.begin(), hosts.end(), ranks[r].host) == hosts.end()) hosts.push_back(ranks[r].host);
    text += (text.empty() ? "" : ", ") + list_ranks(group) + " (" + list_hosts(hosts) + ") " +
            (group.size() == 1 ? "runs " : "run ") + v;
  }
  return text;
}

}  // namespace

RankIdentity this_rank_runs(const std::string& command, const std::string& version, const std::string& commit) {
  char host[MPI_MAX_PROCESSOR_NAME] = {};
  int length = 0;
  MPI_Get_processor_name(host, &length);
  return RankIdentity{command, version, commit, std::string(host, length)};
}

std::string rank_identity_disagreement(const std::vector<RankIdentity>& ranks) {
  const std::string builds =
      groups_by(ranks, [](const RankIdentity& r) { return "ddplab " + r.version + " (commit " + r.commit + ")"; });
  if (!builds.empty()) return "ranks disagree on the build: " + builds + "; every rank needs the same ddplab";
  const std::string commands = groups_by(
      ranks, [](const RankIdentity& r) { return r.command.empty() ? std::string("no subcommand") : r.command; });
  if (!commands.empty()) return "ranks disagree on the subcommand: " + commands;
  return "";
}

std::string identity_disagreement(const RankIdentity& mine, MPI_Comm comm) {
  int size = 1;
  MPI_Comm_size(comm, &size);
  WireIdentity wire{};
  put(wire.command, mine.command);
  put(wire.version, mine.version);
  put(wire.commit, mine.commit);
  put(wire.host, mine.host);
  std::vector<WireIdentity> all(size);
  MPI_Allgather(&wire, sizeof wire, MPI_BYTE, all.data(), sizeof wire, MPI_BYTE, comm);
  std::vector<RankIdentity> ranks;
  ranks.reserve(size);
  for (const WireIdentity& w : all) ranks.push_back({take(w.command), take(w.version), take(w.commit), take(w.host)});
  return rank_identity_disagreement(ranks);
}

}  // namespace ddplab
