// The run file: one HDF5 file per run holding its RunRecord and rank 0's summary of it. Schema: docs/RUN_FILE.md.
// Written by rank 0 into a temporary next to the target and moved into place only when complete, so a failed
// write never leaves a half-written result under the real name.
#pragma once
#include <H5Ipublic.h>

#include <cstdint>
#include <string>

#include "record/run_record.h"

namespace ddplab {

inline constexpr int kRunFileSchemaVersion = 3;

// `summary_json` is stored as the `summary` attribute, for scripts; the reader does not return it (the summary
// is recomputed from the records, which is what the stored one was computed from). The file is synced to disk before
// it is moved into place. Throws std::runtime_error, "cannot write PATH: <reason>" (the operating system's reason,
// "No space left on device", where there is one), leaving nothing behind.
void write_run_file(const std::string& path, bool force, const RunRecord& run, const std::string& summary_json);

// The least the run file of `world_size` ranks x `steps` steps x `buckets` buckets takes, for the check that the
// disk has room before a run: its step and bucket records. The file's own structure (~25 KB: HDF5's headers, the
// run's description) is left out, so that a disk with room for the records and not the file fails at the write, one
// line and exit 5, with nothing half-written (cli_disk_faults).
uint64_t run_file_least_bytes(int world_size, int64_t steps, size_t buckets);

// Throws std::runtime_error with one line, "cannot read run file PATH: <problem>", when the file is missing, not
// HDF5, not a ddplab run file of this schema version, or has a dataset of the wrong shape. Everything is validated
// on the way in, so the code that reads a RunRecord can index freely. Step fields newer than the file read as zero.
RunRecord read_run_file(const std::string& path);
// The same for a file already open (the fuzzer opens an in-memory image); `path` only names it in messages.
RunRecord read_run_file(hid_t file, const std::string& path);

}  // namespace ddplab
