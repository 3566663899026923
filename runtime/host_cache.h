// The host's cache of measured choices, $XDG_CACHE_HOME/ddplab: one JSON file per question that only a measurement
// on this host answers (which OpenBLAS kernels this CPU runs fastest, kernels/cpu/blas_kernels.h; which cuBLASLt
// algorithm each GEMM runs fastest on this GPU, kernels/cuda/gemm.h). A host measures once; every later process, and
// every rank of a job, reads the same answer.
//
// A file is read without its lock and changed only under it (flock on file + ".lock"), written to a temporary that is
// renamed into place: a reader sees the old file or the whole new one, and processes that race change it one at a
// time, each seeing what the one before wrote.
#pragma once
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

namespace ddplab::host_cache {

// $XDG_CACHE_HOME/ddplab (an absolute XDG_CACHE_HOME; else $HOME/.cache/ddplab); "" without either.
std::string directory();

// `name` with every character but letters, digits, '.', '-' and '_' replaced by '-': safe as a file name.
std::string file_name(std::string name);

// The JSON in path; null where the file is absent, unreadable or not JSON (a damaged file is measured again).
nlohmann::json read(const std::string& path);

// What to write given the file's current content (null where absent or damaged); nullopt leaves the file as it is.
using Change = std::function<std::optional<nlohmann::json>(const nlohmann::json& current)>;

// Holding dir/file's lock (dir made if needed): reads the file again and writes what `change` returns. false with
// `error` set where dir is "", cannot be made or locked, or the file cannot be written.
bool update(const std::string& dir, const std::string& file, const Change& change, std::string& error);

}  // namespace ddplab::host_cache
