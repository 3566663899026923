#include "kernels/cuda/gemm_algo_table.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>

#include "runtime/host_cache.h"

namespace ddplab::cuda {
namespace {

// The file's entries: {"<problem>": {"rank": 2, "us": [41.2, 40.9, 38.0, ...]}, ...}; anything else is none.
std::map<std::string, int> ranks_in(const nlohmann::json& file) {
  std::map<std::string, int> ranks;
  if (!file.is_object()) return ranks;
  for (const auto& [problem, entry] : file.items())
    if (entry.is_object() && entry.contains("rank") && entry["rank"].is_number_integer()) {
      const int64_t rank = entry["rank"].get<int64_t>();
      if (rank >= 0 && rank <= std::numeric_limits<int>::max()) ranks[problem] = static_cast<int>(rank);
    }
  return ranks;
}

}  // namespace

GemmAlgoTable::GemmAlgoTable(std::string dir, std::string file)
    : dir_(std::move(dir)), file_(std::move(file)), path_(dir_.empty() ? "" : dir_ + "/" + file_) {}

std::string GemmAlgoTable::default_dir() { return host_cache::directory(); }

std::string GemmAlgoTable::file_name(const std::string& gpu, int sm_major, int sm_minor, int sms,
                                     long cublaslt_version) {
  // "fp32-splitk": ranks among the candidates whose split-K sums stay in fp32 (gemm.cu); a table of ranks among all
  // of them, which an older build wrote, names other algorithms.
  return host_cache::file_name("cublaslt-algos-fp32-splitk_" + gpu + "_sm" + std::to_string(sm_major) +
                               std::to_string(sm_minor) + "_" + std::to_string(sms) + "sms_cublasLt-" +
                               std::to_string(cublaslt_version)) +
         ".json";
}

int64_t GemmAlgoTable::recorded() {
  load();
  return static_cast<int64_t>(ranks_.size());
}

void GemmAlgoTable::load() {
  if (loaded_) return;
  loaded_ = true;
  if (!path_.empty()) ranks_ = ranks_in(host_cache::read(path_));
}

std::optional<int> GemmAlgoTable::find(const std::string& problem, int candidates) {
  load();
  const auto it = ranks_.find(problem);
  if (it == ranks_.end() || it->second >= candidates) return std::nullopt;
  return it->second;
}

int GemmAlgoTable::record(const std::string& problem, int rank, const std::vector<double>& us, int candidates,
                          std::string& error) {
  load();
  int chosen = rank;
  const auto add_unless_known = [&](const nlohmann::json& current) -> std::optional<nlohmann::json> {
    const std::map<std::string, int> known = ranks_in(current);
    for (const auto& [p, r] : known) ranks_[p] = r;  // what other processes recorded meanwhile
    if (const auto it = known.find(problem); it != known.end() && it->second < candidates) {
      chosen = it->second;  // timed first elsewhere: run theirs
      return std::nullopt;
    }
    nlohmann::json next = current.is_object() ? current : nlohmann::json::object();
    nlohmann::json times = nlohmann::json::array();
    for (const double t : us) times.push_back(std::isfinite(t) ? nlohmann::json(std::round(t * 100) / 100) : nullptr);
    next[problem] = {{"rank", rank}, {"us", times}};
    return next;
  };
  // Nowhere to keep it, or a failed write (`error` says why): the choice stays in this table.
  if (!path_.empty()) host_cache::update(dir_, file_, add_unless_known, error);
  ranks_[problem] = chosen;
  return chosen;
}

}  // namespace ddplab::cuda
