// A file a user hands in is read first in a child process. Debian 12's libhdf5 (1.10) trusts fields of a damaged
// file: on some it crashes, loops for good or allocates gigabytes inside its own calls, before any check of ours sees
// a byte (docs/FUZZING.md, "Known libhdf5 bugs"). In a child with its CPU time and memory capped, such a read ends
// the child, not the program, and the program refuses the file in one line; only a read that came through there is
// made again here. Reading twice costs a run file's read once more (~0.1 s of CPU for 12 000 step records, where the
// cap allows 2 s).
#pragma once
#include <functional>
#include <string>

namespace ddplab {

// How a call made in a child process ended.
struct ChildEnd {
  enum class How { kReturned, kThrew, kOutOfMemory, kOutOfTime, kKilled };
  How how = How::kReturned;
  std::string what;  // kThrew: the exception's message; kKilled: the signal's name ("SIGSEGV")
};

// Runs `call` in a forked child process whose CPU time is capped at cpu_s and whose address space may grow by at most
// memory_bytes, and says how it ended. The child runs `call` alone, with its output closed, and leaves by _exit: no
// MPI, CUDA or exit handlers run there. A child that neither ends nor uses its CPU (a lock held across the fork) is
// killed after 30 s plus 4x cpu_s. Where no child can be made, `call` is not run and the end is kReturned.
ChildEnd run_in_child(const std::function<void()>& call, double cpu_s, double memory_bytes);

// Makes `read` of the file at `path` in a child first, capped by the file's size (2 s of CPU plus 0.1 s per MiB; 1 GiB
// of memory plus 4x the file). Where it threw there, throws UsageError with its message; where it crashed, looped or
// ran out of memory, UsageError("<refusal>: <why>"); where it returned, returns, and the caller reads it again.
void read_first_in_child(const std::string& path, const std::string& refusal, const std::function<void()>& read);

}  // namespace ddplab
