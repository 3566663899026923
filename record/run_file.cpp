#include "record/run_file.h"

#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <stdexcept>

#include "record/files.h"
#include "record/hdf5.h"

namespace ddplab {
namespace {

// The steps/ datasets every schema-3 file has; the fields added since read as zero from a file that lacks them.
const char* const kRequiredStepFields[] = {"start_ms",     "data_ms", "forward_ms", "backward_ms",    "exposed_comm_ms",
                                           "optimizer_ms", "step_ms", "comm_ms",    "hidden_comm_ms", "loss"};

// The root string attributes that describe the run. A file that lacks one (older writers had no `device`) reads
// as RunMetadata's default.
const std::pair<const char*, std::string RunMetadata::*> kTextAttrs[] = {
    {"command", &RunMetadata::command},
    {"command_line", &RunMetadata::command_line},
    {"start_time_utc", &RunMetadata::start_time_utc},
    {"git_commit", &RunMetadata::git_commit},
    {"ddplab_version", &RunMetadata::ddplab_version},
    {"mpi_library", &RunMetadata::mpi_library},
    {"hdf5_version", &RunMetadata::hdf5_version},
    {"blas", &RunMetadata::blas},
    {"blas_kernels", &RunMetadata::blas_kernels},
    {"gemm_algorithms", &RunMetadata::gemm_algorithms},
    {"attention_graphs", &RunMetadata::attention_graphs},
    {"cuda", &RunMetadata::cuda},
    {"device", &RunMetadata::device},
    {"transport", &RunMetadata::transport},
    {"stop_reason", &RunMetadata::stop_reason},
};

// Optional columns came later: a file without them reads them as BucketTimes' defaults (comm_cpu_ms not recorded,
// no all-gather).
struct BucketColumn {
  const char* name;
  double BucketTimes::*member;
  bool optional;
};
const BucketColumn kBucketTimes[] = {
    {"ready_ms", &BucketTimes::ready_ms, false},
    {"comm_start_ms", &BucketTimes::comm_start_ms, false},
    {"comm_end_ms", &BucketTimes::comm_end_ms, false},
    {"comm_cpu_ms", &BucketTimes::comm_cpu_ms, true},
    {"gather_start_ms", &BucketTimes::gather_start_ms, true},
    {"gather_end_ms", &BucketTimes::gather_end_ms, true},
};

nlohmann::json link_json(const LinkModel& l) {
  return {{"name", l.name}, {"latency_us", l.latency_us}, {"gbps", l.gbps}};
}
nlohmann::json links_json(const LinkClasses& links) {
  return {{"intra", link_json(links.intra)}, {"inter", link_json(links.inter)}};
}
LinkModel link_from_json(const nlohmann::json& j) {
  return {j.at("name").get<std::string>(), j.at("latency_us").get<double>(), j.at("gbps").get<double>()};
}

// ---- writing ----------------------------------------------------------------------------------------------------

void write_buckets(hid_t file, const RunRecord& run) {
  H5Id group(create_group(file, "buckets"), H5Gclose);
  const hsize_t world = run.world_size(), steps = run.steps, nb = run.buckets.size();
  std::vector<int64_t> first, last, count, bytes;
  std::vector<std::string> pieces;
  for (const BucketRecord& b : run.buckets) {
    first.push_back(b.first_piece);
    last.push_back(b.last_piece);
    count.push_back(b.count);
    bytes.push_back(b.bytes());
    pieces.push_back(b.pieces);
  }
  write_numbers(group, "first_piece", first, {nb}, nullptr);
  write_numbers(group, "last_piece", last, {nb}, nullptr);
  write_numbers(group, "count", count, {nb}, "elements");
  write_numbers(group, "bytes", bytes, {nb}, "bytes");
  write_strings(group, "param_names", pieces);
  if (!run.pieces.empty()) {  // a record put together without its layout (tests, tools) has none to store
    std::vector<int64_t> piece_offset, piece_numel;
    for (const PieceRecord& p : run.pieces) {
      piece_offset.push_back(p.offset);
      piece_numel.push_back(p.numel);
    }
    write_numbers(group, "piece_offset", piece_offset, {piece_offset.size()}, "elements");
    write_numbers(group, "piece_numel", piece_numel, {piece_numel.size()}, "elements");
  }
  std::vector<double> column(run.bucket_times.size());
  for (const auto& [name, member, optional] : kBucketTimes) {
    for (size_t i = 0; i < column.size(); ++i) column[i] = run.bucket_times[i].*member;
    write_numbers(group, name, column, {world, steps, nb}, H5T_IEEE_F64LE, "ms");
  }
}

void write_contents(hid_t file, const RunRecord& run, const std::string& summary_json) {
  const RunMetadata& meta = run.meta;
  write_int_attr(file, "schema_version", kRunFileSchemaVersion);
  for (const auto& [name, member] : kTextAttrs) write_string_attr(file, name, meta.*member);
  write_string_attr(file, "config", run.config.dump());
  write_string_attr(file, "summary", summary_json);
  write_int_attr(file, "first_step", meta.first_step);
  write_int_attr(file, "world_size", meta.world_size);
  write_int_attr(file, "num_steps", run.steps);
  write_strings(file, "hostnames", meta.hostnames);
  if (!meta.gpus.empty()) write_strings(file, "gpus", meta.gpus);  // GPU runs only
  // The topology (optional: older files have neither): each rank's node, and the link classes as emulated.
  if (!meta.node_of_rank.empty())
    write_numbers(file, "node", std::vector<int64_t>(meta.node_of_rank.begin(), meta.node_of_rank.end()),
                  {static_cast<hsize_t>(meta.world_size)}, nullptr);
  write_string_attr(file, "links", links_json(meta.links).dump());
  write_int_attr(file, "host_cores", meta.host_cores);
  if (meta.comm_spin_us) write_int_attr(file, "comm_spin_us", *meta.comm_spin_us);
  if (meta.comm_lost_yield_us) write_int_attr(file, "comm_lost_yield_us", *meta.comm_lost_yield_us);
  if (meta.clock_alignment_us) write_int_attr(file, "clock_alignment_us", *meta.clock_alignment_us);
  write_int_attr(file, "file_writes", meta.file_writes);
  write_int_attr(file, "file_writes_us", meta.file_writes_us);

  H5Id group(create_group(file, "steps"), H5Gclose);
  const hsize_t world = meta.world_size, steps = run.steps;
  std::vector<double> column(run.records.size());
  for (const StepField& f : kStepFields) {
    for (size_t i = 0; i < column.size(); ++i) column[i] = run.records[i].*f.member;
    // Counts as integers (the reader takes either type: the schema is the same).
    write_numbers(group, f.name, column, {world, steps}, f.kind == FieldKind::kCount ? H5T_STD_I64LE : H5T_IEEE_F64LE,
                  f.units);
  }
  write_buckets(file, run);
}

// ---- reading ----------------------------------------------------------------------------------------------------

nlohmann::json parse_json_attr(hid_t file, const char* name) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(read_string_attr(file, name));
  } catch (const nlohmann::json::exception&) {
    throw FileProblem(std::string("attribute ") + name + " is not valid JSON");
  }
  if (!j.is_object()) throw FileProblem(std::string("attribute ") + name + " is not a JSON object");
  return j;
}

// A time or a count that is not finite, or past any a run makes (1e15 ms is 31,000 years): no trainer writes one. A
// damaged file's would print as nan in the tables and vanish from the timeline (JSON has no NaN), and values near the
// double's limit add up to inf, which predict's replay would step through forever. The loss, the gradient norm and
// the validation loss may be anything.
void check_finite(const std::vector<double>& column, const std::string& dataset) {
  constexpr double kLargest = 1e15;
  for (size_t i = 0; i < column.size(); ++i) {
    if (!std::isfinite(column[i]))
      throw FileProblem(dataset + " holds a value that is not finite (element " + std::to_string(i) + ")");
    if (std::fabs(column[i]) > kLargest)
      throw FileProblem(dataset + " holds a value past 1e15, which no run makes (element " + std::to_string(i) + ")");
  }
}

// A duration or a count below zero: no trainer writes one (but steal_ms's and cpu_wait_ms's -1, "not counted", and
// comm_cpu_ms's -1, "not recorded"), and a damaged file's would turn into negative throughputs and shares.
void check_not_negative(const std::vector<double>& column, const std::string& dataset, bool minus_one_is_not_counted) {
  for (size_t i = 0; i < column.size(); ++i)
    if (column[i] < 0 && !(minus_one_is_not_counted && column[i] == -1))
      throw FileProblem(dataset + " holds a negative value (element " + std::to_string(i) + ")");
}

// The global batch (RunRecord::global_batch): an int wherever a trainer counts a step's samples, so the CLI refuses a
// run whose batch x grad_accum x ranks is past one. A file's past one, or with a negative factor, is damaged.
void check_global_batch(const RunRecord& run) {
  const int64_t batch = run.config.value("batch", int64_t{0}), accum = run.config.value("grad_accum", int64_t{1});
  if (batch < 0 || accum < 0 || batch > INT_MAX || accum > INT_MAX || batch * accum > INT_MAX / run.world_size())
    throw FileProblem("config: batch x grad_accum x world_size, " + std::to_string(batch) + " x " +
                      std::to_string(accum) + " x " + std::to_string(run.world_size()) +
                      ", is not a global batch of 0.." + std::to_string(INT_MAX) + " samples");
}

void read_steps(hid_t file, RunRecord& run) {
  H5Id group(open_group(file, "steps", "steps"), H5Gclose);
  for (const char* name : kRequiredStepFields)
    if (!has_link(group, name)) throw FileProblem(std::string("missing dataset steps/") + name);
  const hsize_t world = run.world_size(), steps = run.steps;
  // Every column is read (and its claimed size checked against the file) before the records are allocated.
  std::vector<std::pair<double StepRecord::*, std::vector<double>>> columns;
  for (const StepField& f : kStepFields)
    if (has_link(group, f.name)) {
      columns.emplace_back(f.member, read_doubles(group, f.name, {world, steps}, std::string("steps/") + f.name));
      if (f.kind == FieldKind::kInstant || f.kind == FieldKind::kPhase || f.kind == FieldKind::kTime ||
          f.kind == FieldKind::kCount)
        check_finite(columns.back().second, std::string("steps/") + f.name);
      if (f.kind == FieldKind::kPhase || f.kind == FieldKind::kTime || f.kind == FieldKind::kCount)
        check_not_negative(columns.back().second, std::string("steps/") + f.name,
                           f.member == &StepRecord::steal_ms || f.member == &StepRecord::cpu_wait_ms);
    }
  run.records.assign(world * steps, StepRecord{});
  for (const auto& [member, column] : columns)
    for (size_t i = 0; i < column.size(); ++i) run.records[i].*member = column[i];
}

// The piece layout (files written before it was recorded have none): as many pieces as the buckets cover, in
// ascending order without overlap, and each bucket exactly the span of its pieces — what assign_buckets requires.
void read_pieces(hid_t group, RunRecord& run) {
  const hsize_t np = run.buckets.empty() ? 0 : static_cast<hsize_t>(run.buckets.back().last_piece) + 1;
  const std::vector<int64_t> offset = read_int64s(group, "piece_offset", {np}, "buckets/piece_offset");
  const std::vector<int64_t> numel = read_int64s(group, "piece_numel", {np}, "buckets/piece_numel");
  for (size_t k = 0; k < np; ++k)
    if (numel[k] < 0 || offset[k] < (k ? offset[k - 1] + numel[k - 1] : 0) || offset[k] > INT64_MAX / 8 - numel[k])
      throw FileProblem("buckets/piece_offset and piece_numel: piece " + std::to_string(k) +
                        " does not lie after the previous one");
  int next = 0;
  for (size_t b = 0; b < run.buckets.size(); ++b) {
    const BucketRecord& r = run.buckets[b];
    if (r.first_piece != next || r.last_piece < r.first_piece || static_cast<hsize_t>(r.last_piece) >= np ||
        r.count != offset[r.last_piece] + numel[r.last_piece] - offset[r.first_piece])
      throw FileProblem("bucket " + std::to_string(b) + " is not the span of its pieces");
    next = r.last_piece + 1;
  }
  for (size_t k = 0; k < np; ++k) run.pieces.push_back({offset[k], numel[k]});
}

void read_buckets(hid_t file, RunRecord& run) {
  H5Id group(open_group(file, "buckets", "buckets"), H5Gclose);
  // The number of buckets comes from `bytes`; every other bucket dataset must agree with it.
  const std::vector<hsize_t> dims = dataset_dims(group, "bytes", "buckets/bytes");
  if (dims.size() != 1) throw FileProblem("buckets/bytes has shape " + shape_text(dims) + ", expected [num_buckets]");
  const hsize_t nb = dims[0], world = run.world_size(), steps = run.steps;
  const std::vector<int64_t> bytes = read_int64s(group, "bytes", {nb}, "buckets/bytes");
  const std::vector<int64_t> count = read_int64s(group, "count", {nb}, "buckets/count");
  const std::vector<int64_t> first = read_int64s(group, "first_piece", {nb}, "buckets/first_piece");
  const std::vector<int64_t> last = read_int64s(group, "last_piece", {nb}, "buckets/last_piece");
  const std::vector<std::string> pieces = read_strings(group, "param_names", nb, "buckets/param_names");
  run.buckets.resize(nb);
  for (size_t k = 0; k < nb; ++k) {
    if (first[k] < 0 || last[k] < first[k] || last[k] >= INT_MAX)
      throw FileProblem("buckets/first_piece and last_piece[" + std::to_string(k) + "]: " + std::to_string(first[k]) +
                        ".." + std::to_string(last[k]) + " is not a range of pieces");
    BucketRecord& b = run.buckets[k];
    b.first_piece = static_cast<int>(first[k]);
    b.last_piece = static_cast<int>(last[k]);
    b.count = count[k];
    b.pieces = pieces[k];
    if (count[k] < 0 || count[k] > INT64_MAX / 4 || b.bytes() != bytes[k])
      throw FileProblem("buckets/bytes[" + std::to_string(k) + "] is " + std::to_string(bytes[k]) +
                        ", not 4 x buckets/count (" + std::to_string(count[k]) + ")");
  }
  if (has_link(group, "piece_numel")) read_pieces(group, run);
  for (const auto& [name, member, optional] : kBucketTimes) {  // the required first: they size bucket_times
    if (optional && !has_link(group, name)) continue;
    const std::vector<double> column = read_doubles(group, name, {world, steps, nb}, std::string("buckets/") + name);
    check_finite(column, std::string("buckets/") + name);
    // predict reads any negative comm_cpu_ms as "not recorded": only the writers' kNotRecorded is one.
    static_assert(BucketTimes::kNotRecorded == -1, "check_not_negative lets -1 through as not counted");
    if (member == &BucketTimes::comm_cpu_ms) check_not_negative(column, std::string("buckets/") + name, true);
    run.bucket_times.resize(column.size());
    for (size_t i = 0; i < column.size(); ++i) run.bucket_times[i].*member = column[i];
  }
}

void read_contents(hid_t file, RunRecord& run) {
  if (!has_attr(file, "schema_version")) {
    // A checkpoint, say, names itself by its format attribute.
    const std::string format = has_attr(file, "format") ? read_string_attr(file, "format") : "";
    throw FileProblem("no schema_version attribute (not a ddplab run file" +
                      (format.empty() ? std::string() : ": its format attribute says " + format) + ")");
  }
  const int64_t version = read_int_attr(file, "schema_version");
  if (version != kRunFileSchemaVersion)
    throw FileProblem("schema version " + std::to_string(version) + ", this ddplab reads version " +
                      std::to_string(kRunFileSchemaVersion));
  RunMetadata& meta = run.meta;
  meta.world_size = static_cast<int>(read_int_attr(file, "world_size", 1, 1 << 20));
  run.steps = static_cast<int>(read_int_attr(file, "num_steps", 0, 1 << 30));  // 0: stopped in its first step
  for (const auto& [name, member] : kTextAttrs)
    if (has_attr(file, name)) meta.*member = read_string_attr(file, name);
  // Steps are ints wherever they are numbered (report, summary, timeline): the last must be one too.
  if (has_attr(file, "first_step")) meta.first_step = read_int_attr(file, "first_step", 0, INT_MAX - run.steps);
  if (has_attr(file, "host_cores")) meta.host_cores = static_cast<int>(read_int_attr(file, "host_cores", 0, 1 << 20));
  if (has_attr(file, "comm_spin_us"))
    meta.comm_spin_us = static_cast<int>(read_int_attr(file, "comm_spin_us", INT_MIN, INT_MAX));
  if (has_attr(file, "comm_lost_yield_us"))
    meta.comm_lost_yield_us = static_cast<int>(read_int_attr(file, "comm_lost_yield_us", 0, INT_MAX));
  if (has_attr(file, "clock_alignment_us")) meta.clock_alignment_us = read_int_attr(file, "clock_alignment_us", 0);
  if (has_attr(file, "file_writes"))
    meta.file_writes = static_cast<int>(read_int_attr(file, "file_writes", 0, INT_MAX));
  if (has_attr(file, "file_writes_us")) meta.file_writes_us = read_int_attr(file, "file_writes_us", 0);
  run.config = parse_json_attr(file, "config");
  upgrade_config_keys(run.config);
  parse_json_attr(file, "summary");  // for scripts; the summary is recomputed from the records
  (void)run.first_steady_step();     // a config field of the wrong type throws here, with the file named
  check_global_batch(run);
  meta.hostnames = read_strings(file, "hostnames", meta.world_size, "hostnames");
  if (has_link(file, "gpus")) meta.gpus = read_strings(file, "gpus", meta.world_size, "gpus");
  if (has_link(file, "node")) {
    int nodes = 0;
    for (int64_t node : read_int64s(file, "node", {static_cast<hsize_t>(meta.world_size)}, "node")) {
      if (node < 0 || node > nodes)
        throw FileProblem("node: rank " + std::to_string(meta.node_of_rank.size()) + " is on node " +
                          std::to_string(node) + ", but nodes are numbered 0, 1, ... in the order of their first rank");
      nodes = std::max(nodes, static_cast<int>(node) + 1);
      meta.node_of_rank.push_back(static_cast<int>(node));
    }
  }
  if (has_attr(file, "links")) {
    const nlohmann::json links = parse_json_attr(file, "links");
    try {
      meta.links.intra = link_from_json(links.at("intra"));
      meta.links.inter = link_from_json(links.at("inter"));
    } catch (const nlohmann::json::exception& e) {
      throw FileProblem(std::string("attribute links is not two links' JSON (") + e.what() + ")");
    }
  }
  read_steps(file, run);
  read_buckets(file, run);
}

}  // namespace

void write_run_file(const std::string& path, bool force, const RunRecord& run, const std::string& summary_json) {
  const size_t world = run.world_size(), steps = run.steps;
  if (run.records.size() != world * steps || run.bucket_times.size() != world * steps * run.buckets.size())
    throw std::logic_error("write_run_file: the records do not match world_size x steps (x buckets)");
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);  // our exceptions carry the message; no HDF5 stack dumps
  const std::string tmp = temp_path_for(path);
  try {
    {
      H5Id file(h5(H5Fcreate(tmp.c_str(), H5F_ACC_EXCL, H5P_DEFAULT, H5P_DEFAULT), ("create " + tmp).c_str()),
                H5Fclose);
      write_contents(file, run, summary_json);
      h5(H5Fflush(file, H5F_SCOPE_GLOBAL), "flush");
      h5(H5Fclose(file.release()), "close");  // its failure too: the file is published only once whole
    }
    sync_to_disk(tmp);
  } catch (const std::exception& e) {
    unlink(tmp.c_str());
    throw WriteFailed("cannot write " + path + ": " + e.what());
  }
  publish_file(tmp, path, force);
}

uint64_t run_file_least_bytes(int world_size, int64_t steps, size_t buckets) {
  constexpr size_t kStepColumns = sizeof kStepFields / sizeof kStepFields[0];
  constexpr size_t kBucketColumns = sizeof kBucketTimes / sizeof kBucketTimes[0];
  return static_cast<uint64_t>(world_size) * steps * (kStepColumns + kBucketColumns * buckets) * sizeof(double);
}

RunRecord read_run_file(const std::string& path) {
  hid_t id = -1;
  try {
    id = open_for_reading(path);
  } catch (const FileProblem& e) {
    throw std::runtime_error("cannot read run file " + path + ": " + e.what());
  }
  H5Id file(id, H5Fclose);
  return read_run_file(file, path);
}

RunRecord read_run_file(hid_t file, const std::string& path) {
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);  // our one-line errors replace HDF5's stack dumps
  RunRecord run;
  run.path = path;
  try {
    read_contents(file, run);
  } catch (const FileProblem& e) {
    throw std::runtime_error("cannot read run file " + path + ": " + e.what());
  } catch (const nlohmann::json::exception& e) {
    throw std::runtime_error("cannot read run file " + path + ": unexpected config JSON (" + e.what() + ")");
  }
  return run;
}

}  // namespace ddplab
