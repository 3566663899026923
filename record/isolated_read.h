// A file a user hands in is read first in a child process. Debian 12's libhdf5 (1.10) trusts fields of a damaged
// file: on some it crashes, loops for good or allocates gigabytes inside its own calls, before any check of ours sees
// a byte (docs/FUZZING.md, "Known libhdf5 bugs"). In a child with its CPU time and memory capped, such a read ends
// the child, not the program, and the program refuses the file in one line; only a read that came through there is
// made again here. Reading twice costs a run file's read once more (~0.1 s of CPU for 12 000 step records, where the
// cap allows 2 s), a checkpoint's too (a resume's setup reads it twice). A file refused once is refused again without
// another child.
#pragma once
#include <functional>
#include <string>

namespace ddplab {

// How a call made in a child process ended.
struct ChildEnd {
  // kPastCpuCap: it used its CPU cap (a loop); kBlocked: the wall-clock cap came first (it waited without using its
  // CPU)
  enum class How { kReturned, kThrew, kOutOfMemory, kPastCpuCap, kBlocked, kKilled };
  How how = How::kReturned;
  std::string what;          // kThrew: the exception's message; kKilled: the signal's name ("SIGSEGV", "SIGKILL")
  bool usage_error = false;  // kThrew: the exception was a UsageError (bad input), not another failure
};

// A child's caps: its CPU time, how far its address space may grow, and the wall-clock time after which it is killed
// (one that neither ends nor uses its CPU: blocked on a file system, or on a lock held across the fork).
struct ChildCaps {
  double cpu_s = 0, memory_bytes = 0, wall_s = 0;
};

// Runs `call` in a forked child process under `caps` and says how it ended. The child runs `call` alone, with its
// output closed, and leaves by _exit: no MPI, CUDA or exit handlers run there. Where no child can be made, `call` is
// not run and the end is kReturned.
ChildEnd run_in_child(const std::function<void()>& call, const ChildCaps& caps);

// Makes `read` of the file at `path` in a child first, capped by the file's size (2 s of CPU and 1 s more for every
// 10 MiB; 1 GiB of memory plus 4x the file; 30 s plus 4x the CPU cap in all). Where it threw there, throws its message
// again, as a UsageError where it was one, else as std::runtime_error; where it crashed, looped or ran out of memory,
// UsageError("<refusal>: <why>"); where it returned, returns, and the caller reads it again.
void read_first_in_child(const std::string& path, const std::string& refusal, const std::function<void()>& read);

}  // namespace ddplab
