// Which cuBLASLt algorithm each GEMM problem runs when the context times its candidates (GemmContext::set_timed_algos):
// the rank, among the heuristic's answers, of the one that ran fastest, kept in the host's cache
// (runtime/host_cache.h), one file per GPU model and cuBLASLt version. The first process to time a problem writes its
// answer; every process after it, and one that timed the same problem meanwhile, runs the written one: runs on a host
// compute alike (a resumed run continues bit for bit), whatever their timings said.
//
// Host code only (no device, no cuBLAS): the device's name and the library's version come in as the file's name.
#pragma once
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace ddplab::cuda {

class GemmAlgoTable {
 public:
  // dir "": nothing is read or written; the choices stay in this table (no HOME, or a test).
  GemmAlgoTable(std::string dir, std::string file);

  // The host's cache (host_cache::directory()), where runs keep their tables; "" without one.
  static std::string default_dir();
  // "cublaslt-algos-fp32-splitk_<gpu>_sm<major><minor>_<sms>sms_cublasLt-<version>.json", made safe as a file name.
  static std::string file_name(const std::string& gpu, int sm_major, int sm_minor, int sms, long cublaslt_version);

  // The rank recorded for `problem`, where it is one of the `candidates` the heuristic gives now (the file is read
  // on the first call; a damaged entry is none).
  std::optional<int> find(const std::string& problem, int candidates);

  // Records `rank` (with each candidate's time in µs, for the record) unless the file has a usable rank for
  // `problem` already; returns the rank to run, the file's. Where the file cannot be written, `rank`, kept here, and
  // `error` says why.
  int record(const std::string& problem, int rank, const std::vector<double>& us, int candidates, std::string& error);

  const std::string& path() const { return path_; }
  int64_t recorded();  // problems this table knows: the file's (read now if not yet) and this process's

 private:
  void load();
  std::string dir_, file_, path_;
  bool loaded_ = false;
  std::map<std::string, int> ranks_;  // the file's, as last read, and this process's where unwritten
};

}  // namespace ddplab::cuda
