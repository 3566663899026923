#include "record/run_file.h"

#include <hdf5.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <type_traits>

#include "record/files.h"
#include "record/h5util.h"

namespace ddplab {
namespace {

void write_string_list(hid_t loc, const char* name, const std::vector<std::string>& values) {
  std::vector<const char*> ptrs;
  for (const auto& v : values) ptrs.push_back(v.c_str());
  H5Id type(utf8_string_type(), H5Tclose);
  const hsize_t dims[1] = {values.size()};
  H5Id space(h5(H5Screate_simple(1, dims, nullptr), "H5Screate_simple"), H5Sclose);
  H5Id set(h5(H5Dcreate2(loc, name, type, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), name), H5Dclose);
  h5(H5Dwrite(set, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, ptrs.data()), name);
}

// A dataset of any rank from a flat row-major array; `units` (if any) as an attribute.
template <typename T>
void write_array(hid_t loc, const char* name, const std::vector<T>& data, std::vector<hsize_t> dims,
                 const char* units) {
  const bool is_double = std::is_same_v<T, double>;
  static_assert(std::is_same_v<T, double> || std::is_same_v<T, int64_t>);
  H5Id space(h5(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr), "H5Screate_simple"), H5Sclose);
  const hid_t file_type = is_double ? H5T_IEEE_F64LE : H5T_STD_I64LE;
  const hid_t mem_type = is_double ? H5T_NATIVE_DOUBLE : H5T_NATIVE_INT64;
  H5Id set(h5(H5Dcreate2(loc, name, file_type, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), name), H5Dclose);
  if (!data.empty()) h5(H5Dwrite(set, mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data.data()), name);
  if (units) write_string_attr(set, "units", units);
}

void write_buckets(hid_t file, const RunBuckets& buckets, hsize_t world, hsize_t steps) {
  H5Id group(h5(H5Gcreate2(file, "buckets", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), "create /buckets"), H5Gclose);
  const hsize_t nb = buckets.layout.size();
  std::vector<int64_t> first, last, count, bytes;
  for (const Bucket& b : buckets.layout) {
    first.push_back(b.first_piece);
    last.push_back(b.last_piece);
    count.push_back(b.count);
    bytes.push_back(b.count * static_cast<int64_t>(sizeof(float)));
  }
  write_array(group, "first_piece", first, {nb}, nullptr);
  write_array(group, "last_piece", last, {nb}, nullptr);
  write_array(group, "count", count, {nb}, "elements");
  write_array(group, "bytes", bytes, {nb}, "bytes");
  write_string_list(group, "param_names", buckets.names);
  if (buckets.times.size() != world * steps * nb) throw std::logic_error("write_run_file: bucket times size");
  std::vector<double> column(buckets.times.size());
  const std::pair<const char*, double BucketTimes::*> fields[] = {{"ready_ms", &BucketTimes::ready_ms},
                                                                  {"comm_start_ms", &BucketTimes::comm_start_ms},
                                                                  {"comm_end_ms", &BucketTimes::comm_end_ms}};
  for (const auto& [name, member] : fields) {
    for (size_t i = 0; i < column.size(); ++i) column[i] = buckets.times[i].*member;
    write_array(group, name, column, {world, steps, nb}, "ms");
  }
}

bool exists(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0;
}

std::string folder_of(const std::string& path) {
  const auto slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

void write_contents(hid_t file, const RunMetadata& meta, const std::vector<StepRecord>& records, int steps,
                    const std::string& summary_json, const RunBuckets& buckets) {
  write_int_attr(file, "schema_version", kRunFileSchemaVersion);
  write_string_attr(file, "command", meta.command);
  write_string_attr(file, "config", meta.config_json);
  write_string_attr(file, "command_line", meta.command_line);
  write_string_attr(file, "start_time_utc", meta.start_time_utc);
  write_string_attr(file, "git_commit", meta.git_commit);
  write_string_attr(file, "ddplab_version", meta.ddplab_version);
  write_string_attr(file, "mpi_library", meta.mpi_library);
  write_string_attr(file, "hdf5_version", meta.hdf5_version);
  write_string_attr(file, "blas", meta.blas);
  write_string_attr(file, "cuda", meta.cuda);
  write_string_attr(file, "device", meta.device);
  write_string_attr(file, "summary", summary_json);
  write_string_attr(file, "stop_reason", meta.stop_reason);
  write_int_attr(file, "first_step", meta.first_step);
  write_int_attr(file, "world_size", meta.world_size);
  write_int_attr(file, "num_steps", steps);
  write_string_list(file, "hostnames", meta.hostnames);

  H5Id group(h5(H5Gcreate2(file, "steps", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), "create /steps"), H5Gclose);
  const size_t world = meta.world_size;
  std::vector<double> column(world * steps);
  for (const auto& [name, member] : kStepFields) {
    for (size_t i = 0; i < column.size(); ++i) column[i] = records[i].*member;
    write_array(group, name, column, {world, static_cast<hsize_t>(steps)}, step_field_units(name));
  }
  write_buckets(file, buckets, world, steps);
}

}  // namespace

std::string check_output_path(const std::string& path, bool force) {
  if (path.empty()) return "output path is empty";
  if (exists(path) && !force) return "output file " + path + " already exists (pass --force to overwrite)";
  const std::string folder = folder_of(path);
  struct stat st;
  if (stat(folder.c_str(), &st) != 0) return "output folder " + folder + " does not exist";
  if (!S_ISDIR(st.st_mode)) return "output folder " + folder + " is not a folder";
  if (access(folder.c_str(), W_OK) != 0) return "output folder " + folder + " is not writable";
  return "";
}

void write_run_file(const std::string& path, bool force, const RunMetadata& meta, const std::vector<StepRecord>& records,
                    int steps, const std::string& summary_json, const RunBuckets& buckets) {
  if (records.size() != static_cast<size_t>(meta.world_size) * steps)
    throw std::logic_error("write_run_file: records do not match world_size * steps");
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);  // our exceptions carry the message; no HDF5 stack dumps
  const std::string tmp = temp_path_for(path);
  try {
    H5Id file(h5(H5Fcreate(tmp.c_str(), H5F_ACC_EXCL, H5P_DEFAULT, H5P_DEFAULT), ("create " + tmp).c_str()), H5Fclose);
    write_contents(file, meta, records, steps, summary_json, buckets);
    h5(H5Fflush(file, H5F_SCOPE_GLOBAL), "flush");
  } catch (...) {
    unlink(tmp.c_str());
    throw;
  }
  publish_file(tmp, path, force);
}

}  // namespace ddplab
