// The DDPLAB_* tuning knobs, in NCCL's manner (NCCL_PARAM): one table, each read from the environment once, on first
// use, and checked then (a bad value throws naming the variable). `ddplab devices` lists every knob with its value
// and whether it came from the environment. Their defaults were measured on the development machines: docs/COMM.md.
#pragma once
#include <mpi.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace ddplab::settings {

// A knob set to a value it does not take: bad input, which ddplab refuses like a bad flag (one line, exit code 2).
struct BadSetting : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};

struct Knob {
  const char* name;          // the environment variable
  const char* default_text;  // what applies when it is unset
  const char* meaning;       // one line for `ddplab devices`
  // What it takes: an integer in [min, max], or one of `choices` ("shm|mpi"); any text where max < min and no choices.
  int64_t min = 0, max = -1;
  const char* choices = nullptr;
  int64_t multiple_of = 1;  // an integer's unit (bytes of whole floats)
};

// The ring's pipeline: bytes of fp32 per slice (one message per chunk per round; 0 = no slicing), and slices per
// chunk (the depth of one step; the ring runs in rounds of n x this x slice). Bounded so that a round's element
// count cannot wrap around size_t at any rank count.
inline constexpr Knob kRingSliceBytes{"DDPLAB_RING_SLICE_BYTES",
                                      "262144",
                                      "bytes of fp32 per ring slice (0: no slicing)",
                                      0,
                                      int64_t{1} << 30,
                                      nullptr,
                                      sizeof(float)};
inline constexpr Knob kRingSlicesPerChunk{"DDPLAB_RING_SLICES_PER_CHUNK", "4", "ring slices per chunk, at least 1", 1,
                                          1024};
// Buffers up to this many fp32 bytes use recursive doubling; 0 = always the ring. Its default depends on the world
// size and on what it competes with, the ring or the direct all-reduce (docs/COMM.md); the knob's text names these
// values (tests/unit/test_settings.cpp holds it to that).
inline constexpr int64_t kSmallAllreduceBytesAtTwoRanks = 16384, kSmallAllreduceBytesBeyond = 32768,
                         kSmallAllreduceBytesAtTwoRanksBesideDirect = 2048;
inline constexpr Knob kSmallAllreduceBytes{
    "DDPLAB_SMALL_ALLREDUCE_BYTES", "16384 at 2 ranks (2048 beside the direct all-reduce), 32768 beyond",
    "largest buffer for recursive doubling, bytes (0: always the ring)", 0, int64_t{1} << 40};
inline constexpr Knob kCommTransport{
    "DDPLAB_COMM_TRANSPORT", "shm", "the ring's transport: shm (MPI across nodes) or mpi", 0, -1, "shm|mpi"};
// Whether gradient buffers are allocated in shared memory that host peers read directly (comm/shm_transport.h).
inline constexpr Knob kLocalRegister{"DDPLAB_LOCAL_REGISTER", "1",
                                     "1: gradient buffers registered with the shm transport (single copy); 0: copied",
                                     0, 1};
// Whether ranks that all share one host all-reduce (and, for --zero-stage 1, reduce-scatter and all-gather)
// registered fp32 buffers directly (comm/shm_direct.h) above the recursive-doubling size, instead of by
// the ring.
inline constexpr Knob kDirectAllreduce{"DDPLAB_DIRECT_ALLREDUCE", "1",
                                       "1: ranks all on one host all-reduce registered buffers directly (two-shot; "
                                       "--zero-stage 1's reduce-scatter and all-gather too); 0: the ring",
                                       0, 1};
// The comm thread's waits: poll for spin_us, then sleep between polls, doubling up to max_sleep_us.
inline constexpr Knob kCommSpinUs{"DDPLAB_COMM_SPIN_US", "50",
                                  "us a waiting comm thread polls before it sleeps (<0: spin)", INT32_MIN, INT32_MAX};
inline constexpr Knob kCommMaxSleepUs{"DDPLAB_COMM_MAX_SLEEP_US", "250", "longest sleep between polls, us, at least 1",
                                      1, INT32_MAX};
// Read by main() before MPI starts (it may run the program again with other OpenBLAS kernels); checked with the rest
// once MPI is up.
inline constexpr Knob kBlasAuto{"DDPLAB_BLAS_AUTO",
                                "on",
                                "off: keep OpenBLAS's own kernel family (no choice by CPU features and probe, "
                                "docs/ARCHITECTURE.md)",
                                0,
                                -1,
                                "on|off"};

// `ddplab train`'s page beside its run file costs seconds of matplotlib on rank 0 after the run: off for scripts that
// train in a loop (and the test suite); `ddplab report --html` draws it later from the run file.
inline constexpr Knob kTrainPage{"DDPLAB_TRAIN_PAGE", "on",
                                 "off: ddplab train writes no <stem>.report.html beside its run file", 0, -1, "on|off"};

// How long MPI_Init and MPI_Finalize wait for every rank of the job before this rank leaves (runtime/mpi_init.h): the
// watchdog's default bound (--timeout-s), which a launcher loading every rank's binary and CUDA's libraries from a
// cold shared disk, or rank 0 writing a suite's charts while the others finalize, stays well inside. Read before MPI
// starts, checked with the rest once it is up.
inline constexpr Knob kMpiWaitS{"DDPLAB_MPI_WAIT_S", "300",
                                "seconds MPI_Init and MPI_Finalize wait for every rank before this rank leaves "
                                "(exit code 3)",
                                1, 86400};

// cuDNN's attention (--attention cudnn, or auto's pick) on batches whose S varies step to step: a graph specialised to
// each shape, or dynamic-shape graphs that share their compiled kernels (kernels/cuda/cudnn_attention.h).
inline constexpr Knob kCudnnShapes{"DDPLAB_CUDNN_SHAPES",
                                   "static",
                                   "cuDNN attention's graphs: static (one compiled per shape) or dynamic (one kernel "
                                   "cache per structure; a new shape plans, not compiles)",
                                   0,
                                   -1,
                                   "static|dynamic"};

inline constexpr const Knob* kKnobs[] = {&kRingSliceBytes, &kRingSlicesPerChunk, &kSmallAllreduceBytes,
                                         &kCommTransport,  &kLocalRegister,      &kDirectAllreduce,
                                         &kCommSpinUs,     &kCommMaxSleepUs,     &kBlasAuto,
                                         &kTrainPage,      &kMpiWaitS,           &kCudnnShapes};

// The knob's value: the environment's, read once, or its default_text when it is unset or empty (`fallback`, for a
// default computed by the caller). Throws BadSetting when it is set to what the knob does not take.
int64_t integer(const Knob& knob);
int64_t integer(const Knob& knob, int64_t fallback);
std::string choice(const Knob& knob);
// Every knob set in the environment, checked (and read): main() calls it on every rank before any work, so a bad
// value is refused there, whichever knobs the command would have read and when.
void check_all();
// Collective: every knob but DDPLAB_BLAS_AUTO holds the same text on every rank of comm (runtime/agreement.h). Each
// rank reads its own environment, and ranks that differ could wait on each other in different algorithms or cut
// buffers differently: refused instead, with BadSetting naming each knob that differs and two ranks' values.
void check_same_on_every_rank(MPI_Comm comm);

// "DDPLAB_RING_SLICE_BYTES  262144 (default)  bytes of fp32 per ring slice ...", a line per knob: what `ddplab
// devices` prints.
std::vector<std::string> describe();

}  // namespace ddplab::settings
