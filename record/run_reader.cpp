#include "record/run_reader.h"

#include <hdf5.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <type_traits>

#include "record/files.h"
#include "record/run_file.h"

namespace ddplab {

const std::vector<std::string> kRequiredStepFields = {"start_ms",        "data_ms",      "forward_ms", "backward_ms",
                                                      "exposed_comm_ms", "optimizer_ms", "step_ms",    "comm_ms",
                                                      "hidden_comm_ms",  "loss"};

namespace {

constexpr int64_t kSchemaVersion = kRunFileSchemaVersion;  // what this reader understands: what this build writes

// A problem with the file's contents; read_run_file() prefixes the path.
struct Bad : std::runtime_error {
  using std::runtime_error::runtime_error;
};

std::string shape_text(const std::vector<hsize_t>& dims) {
  std::string s = "[";
  for (size_t i = 0; i < dims.size(); ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
  return s + "]";
}

std::vector<hsize_t> dims_of(hid_t space) {
  const int n = H5Sget_simple_extent_ndims(space);
  if (n < 0) throw Bad("cannot read a dataspace");
  std::vector<hsize_t> dims(n);
  if (n > 0) H5Sget_simple_extent_dims(space, dims.data(), nullptr);
  return dims;
}

// Reads strings of either HDF5 kind (variable-length, as ddplab writes them, or fixed-length) from an attribute
// or a dataset; `count` elements.
template <bool kIsAttr>
std::vector<std::string> read_strings(hid_t obj, hid_t file_type, hid_t space, size_t count, const std::string& what) {
  if (H5Tget_class(file_type) != H5T_STRING) throw Bad(what + " is not a string");
  std::vector<std::string> out;
  H5Id mem(H5Tcopy(H5T_C_S1), H5Tclose);
  if (H5Tis_variable_str(file_type) > 0) {
    H5Tset_size(mem, H5T_VARIABLE);
    H5Tset_cset(mem, H5Tget_cset(file_type));
    std::vector<char*> ptrs(count, nullptr);
    const herr_t rc =
        kIsAttr ? H5Aread(obj, mem, ptrs.data()) : H5Dread(obj, mem, H5S_ALL, H5S_ALL, H5P_DEFAULT, ptrs.data());
    if (rc < 0) throw Bad("cannot read " + what);
    for (char* p : ptrs) out.emplace_back(p ? p : "");
    if (kIsAttr) {
      for (char* p : ptrs) H5free_memory(p);
    } else {
      H5Dvlen_reclaim(mem, space, H5P_DEFAULT, ptrs.data());
    }
  } else {
    const size_t width = H5Tget_size(file_type);
    H5Tset_size(mem, width);
    std::vector<char> buf(width * count + 1, '\0');
    const herr_t rc =
        kIsAttr ? H5Aread(obj, mem, buf.data()) : H5Dread(obj, mem, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf.data());
    if (rc < 0) throw Bad("cannot read " + what);
    for (size_t i = 0; i < count; ++i) out.emplace_back(std::string(buf.data() + i * width, width).c_str());
  }
  return out;
}

std::string read_string_attr(hid_t loc, const std::string& name) {
  if (H5Aexists(loc, name.c_str()) <= 0) throw Bad("no attribute " + name);
  H5Id attr(H5Aopen(loc, name.c_str(), H5P_DEFAULT), H5Aclose);
  H5Id type(H5Aget_type(attr), H5Tclose);
  H5Id space(H5Aget_space(attr), H5Sclose);
  if (!attr.ok() || !type.ok() || !space.ok()) throw Bad("cannot open attribute " + name);
  if (H5Sget_simple_extent_npoints(space) != 1) throw Bad("attribute " + name + " is not a single value");
  return read_strings<true>(attr, type, space, 1, "attribute " + name).front();
}

int64_t read_int_attr(hid_t loc, const std::string& name) {
  if (H5Aexists(loc, name.c_str()) <= 0) throw Bad("no attribute " + name);
  H5Id attr(H5Aopen(loc, name.c_str(), H5P_DEFAULT), H5Aclose);
  H5Id type(H5Aget_type(attr), H5Tclose);
  H5Id space(H5Aget_space(attr), H5Sclose);
  if (!attr.ok() || !type.ok() || !space.ok()) throw Bad("cannot open attribute " + name);
  if (H5Tget_class(type) != H5T_INTEGER || H5Sget_simple_extent_npoints(space) != 1)
    throw Bad("attribute " + name + " is not an integer");
  long long v = 0;
  if (H5Aread(attr, H5T_NATIVE_LLONG, &v) < 0) throw Bad("cannot read attribute " + name);
  return v;
}

// Every string attribute of `loc`, by name (integers are read by name where needed).
herr_t collect_string_attr(hid_t loc, const char* name, const H5A_info_t*, void* out) {
  H5Id attr(H5Aopen(loc, name, H5P_DEFAULT), H5Aclose);
  H5Id type(H5Aget_type(attr), H5Tclose);
  if (attr.ok() && type.ok() && H5Tget_class(type) == H5T_STRING) {
    try {
      (*static_cast<std::map<std::string, std::string>*>(out))[name] = read_string_attr(loc, name);
    } catch (const Bad&) {
      return -1;
    }
  }
  return 0;
}

nlohmann::json parse_json_attr(const RunData& run, const std::string& name) {
  const auto it = run.attrs.find(name);
  if (it == run.attrs.end()) throw Bad("no attribute " + name);
  try {
    return nlohmann::json::parse(it->second);
  } catch (const nlohmann::json::exception&) {
    throw Bad("attribute " + name + " is not valid JSON");
  }
}

// Refuses a dataset that claims more data than the file can hold for it. A damaged file can declare, say,
// buckets/bytes of 2^32 elements with no data behind them (HDF5 would read fill values), and the reader would
// allocate for the claim. ddplab writes contiguous, uncompressed datasets; a chunked one (another writer, maybe
// compressed) may expand up to 1024x, about deflate's limit.
void check_stored(hid_t set, const std::string& name, const std::vector<hsize_t>& dims) {
  H5Id type(H5Dget_type(set), H5Tclose);
  H5Id create(H5Dget_create_plist(set), H5Pclose);
  H5Id file(H5Iget_file_id(set), H5Fclose);
  hsize_t file_size = 0;
  if (!type.ok() || !create.ok() || !file.ok() || H5Fget_filesize(file, &file_size) < 0)
    throw Bad("cannot read " + name);
  hsize_t bytes = H5Tget_size(type);
  for (hsize_t d : dims)
    if (__builtin_mul_overflow(bytes, d, &bytes)) throw Bad(name + " is too large");
  const hsize_t stored = std::min<hsize_t>(H5Dget_storage_size(set), file_size);
  if (bytes > (H5Pget_layout(create) == H5D_CHUNKED ? stored * 1024 : stored))
    throw Bad(name + " claims " + std::to_string(bytes) + " bytes of data, the file holds " + std::to_string(stored));
}

// Opens `name` under `loc` as a dataset of exactly `want` dims.
hid_t open_dataset(hid_t loc, const std::string& name, const std::vector<hsize_t>& want) {
  if (H5Lexists(loc, name.c_str(), H5P_DEFAULT) <= 0) throw Bad("missing dataset " + name);
  const hid_t set = H5Dopen2(loc, name.c_str(), H5P_DEFAULT);
  if (set < 0) throw Bad(name + " is not a dataset");
  H5Id space(H5Dget_space(set), H5Sclose);
  const std::vector<hsize_t> dims = space.ok() ? dims_of(space) : std::vector<hsize_t>{};
  if (dims != want) {
    H5Dclose(set);
    throw Bad(name + " has shape " + shape_text(dims) + ", expected " + shape_text(want));
  }
  try {
    check_stored(set, name, dims);
  } catch (const Bad&) {
    H5Dclose(set);
    throw;
  }
  return set;
}

template <typename T>
std::vector<T> read_numbers(hid_t loc, const std::string& name, const std::vector<hsize_t>& want) {
  static_assert(std::is_same_v<T, double> || std::is_same_v<T, int64_t>);
  H5Id set(open_dataset(loc, name, want), H5Dclose);
  H5Id type(H5Dget_type(set), H5Tclose);
  const H5T_class_t cls = H5Tget_class(type);
  if (cls != H5T_FLOAT && cls != H5T_INTEGER) throw Bad(name + " is not numeric");
  size_t n = 1;
  for (hsize_t d : want) n *= d;
  std::vector<T> out(n);
  const hid_t mem = std::is_same_v<T, double> ? H5T_NATIVE_DOUBLE : H5T_NATIVE_INT64;
  if (n > 0 && H5Dread(set, mem, H5S_ALL, H5S_ALL, H5P_DEFAULT, out.data()) < 0) throw Bad("cannot read " + name);
  return out;
}

std::vector<std::string> read_string_dataset(hid_t loc, const std::string& name, hsize_t count) {
  H5Id set(open_dataset(loc, name, {count}), H5Dclose);
  H5Id type(H5Dget_type(set), H5Tclose);
  H5Id space(H5Dget_space(set), H5Sclose);
  return read_strings<false>(set, type, space, count, name);
}

// Names of the datasets directly under `group`.
std::vector<std::string> dataset_names(hid_t group) {
  H5G_info_t info;
  if (H5Gget_info(group, &info) < 0) throw Bad("cannot list group steps");
  std::vector<std::string> names;
  for (hsize_t i = 0; i < info.nlinks; ++i) {
    const ssize_t len = H5Lget_name_by_idx(group, ".", H5_INDEX_NAME, H5_ITER_INC, i, nullptr, 0, H5P_DEFAULT);
    if (len < 0) continue;
    std::string name(static_cast<size_t>(len) + 1, '\0');
    H5Lget_name_by_idx(group, ".", H5_INDEX_NAME, H5_ITER_INC, i, name.data(), name.size(), H5P_DEFAULT);
    name.resize(static_cast<size_t>(len));
    H5Id obj(H5Oopen(group, name.c_str(), H5P_DEFAULT), H5Oclose);
    if (obj.ok() && H5Iget_type(obj) == H5I_DATASET) names.push_back(name);
  }
  return names;
}

void read_contents(hid_t file, RunData& run) {
  if (H5Aexists(file, "schema_version") <= 0) throw Bad("no schema_version attribute (not a ddplab run file)");
  run.schema_version = read_int_attr(file, "schema_version");
  if (run.schema_version != kSchemaVersion)
    throw Bad("schema version " + std::to_string(run.schema_version) + ", this ddplab reads version " +
              std::to_string(kSchemaVersion));
  const int64_t world = read_int_attr(file, "world_size");
  const int64_t steps = read_int_attr(file, "num_steps");
  if (world < 1 || world > (1 << 20)) throw Bad("world_size " + std::to_string(world) + " is out of range");
  if (steps < 1 || steps > (int64_t{1} << 30)) throw Bad("num_steps " + std::to_string(steps) + " is out of range");
  run.world_size = static_cast<int>(world);
  run.num_steps = static_cast<int>(steps);
  if (H5Aiterate2(file, H5_INDEX_NAME, H5_ITER_INC, nullptr, collect_string_attr, &run.attrs) < 0)
    throw Bad("cannot read the string attributes");
  run.config = parse_json_attr(run, "config");
  run.summary = parse_json_attr(run, "summary");
  if (!run.config.is_object() || !run.summary.is_object()) throw Bad("config or summary is not a JSON object");
  (void)run.first_steady_step();  // a field of the wrong type throws here, with the file named, not later
  (void)run.global_batch();

  const hsize_t w = world, s = steps;
  run.hostnames = read_string_dataset(file, "hostnames", w);

  if (H5Lexists(file, "steps", H5P_DEFAULT) <= 0) throw Bad("missing group steps");
  H5Id group(H5Gopen2(file, "steps", H5P_DEFAULT), H5Gclose);
  if (!group.ok()) throw Bad("steps is not a group");
  for (const std::string& name : kRequiredStepFields)
    if (H5Lexists(group, name.c_str(), H5P_DEFAULT) <= 0) throw Bad("missing dataset steps/" + name);
  for (const std::string& name : dataset_names(group)) {
    try {
      run.steps[name] = read_numbers<double>(group, name, {w, s});
    } catch (const Bad& e) {
      throw Bad("steps/" + std::string(e.what()));
    }
  }

  if (H5Lexists(file, "buckets", H5P_DEFAULT) <= 0) throw Bad("missing group buckets");
  H5Id bgroup(H5Gopen2(file, "buckets", H5P_DEFAULT), H5Gclose);
  if (!bgroup.ok()) throw Bad("buckets is not a group");
  BucketData& b = run.buckets;
  try {
    // The number of buckets comes from `bytes`; every other bucket dataset must agree with it.
    if (H5Lexists(bgroup, "bytes", H5P_DEFAULT) <= 0) throw Bad("missing dataset bytes");
    H5Id set(H5Dopen2(bgroup, "bytes", H5P_DEFAULT), H5Dclose);
    H5Id space(set.ok() ? H5Dget_space(set) : -1, H5Sclose);
    if (!space.ok()) throw Bad("bytes is not a dataset");
    const std::vector<hsize_t> dims = dims_of(space);
    if (dims.size() != 1) throw Bad("bytes has shape " + shape_text(dims) + ", expected [num_buckets]");
    const hsize_t nb = dims[0];
    b.bytes = read_numbers<int64_t>(bgroup, "bytes", {nb});
    b.count = read_numbers<int64_t>(bgroup, "count", {nb});
    b.first_piece = read_numbers<int64_t>(bgroup, "first_piece", {nb});
    b.last_piece = read_numbers<int64_t>(bgroup, "last_piece", {nb});
    b.param_names = read_string_dataset(bgroup, "param_names", nb);
    b.ready_ms = read_numbers<double>(bgroup, "ready_ms", {w, s, nb});
    b.comm_start_ms = read_numbers<double>(bgroup, "comm_start_ms", {w, s, nb});
    b.comm_end_ms = read_numbers<double>(bgroup, "comm_end_ms", {w, s, nb});
  } catch (const Bad& e) {
    throw Bad("buckets/" + std::string(e.what()));
  }
}

}  // namespace

double RunData::step(const std::string& field, int rank, int s) const {
  const auto it = steps.find(field);
  return it == steps.end() ? 0.0 : it->second[static_cast<size_t>(rank) * num_steps + s];
}

int RunData::first_steady_step() const {
  int first = summary.value("first_steady_step", config.value("warmup_steps", 0));
  return std::clamp(first, 0, std::max(num_steps - 1, 0));
}

int RunData::global_batch() const {
  const int fallback = config.value("batch", 0) * config.value("grad_accum", 1) * world_size;
  return summary.value("global_batch", fallback);
}

std::string RunData::host(int rank) const {
  return rank >= 0 && rank < static_cast<int>(hostnames.size()) ? hostnames[rank] : "?";
}

RunData read_run_file(const std::string& path) {
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);  // our one-line errors replace HDF5's stack dumps
  const std::string prefix = "cannot read run file " + path + ": ";
  struct stat st;
  if (stat(path.c_str(), &st) != 0) throw std::runtime_error(prefix + std::strerror(errno));
  if (S_ISDIR(st.st_mode)) throw std::runtime_error(prefix + "is a folder");
  if (st.st_size == 0) throw std::runtime_error(prefix + "empty file (not HDF5)");
  if (H5Fis_hdf5(path.c_str()) <= 0) throw std::runtime_error(prefix + "not an HDF5 file");
  H5Id file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  if (!file.ok()) throw std::runtime_error(prefix + "HDF5 cannot open it (damaged or unreadable)");
  return read_run_file(file, path);
}

RunData read_run_file(hid_t file, const std::string& path) {
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  const std::string prefix = "cannot read run file " + path + ": ";
  RunData run;
  run.path = path;
  try {
    read_contents(file, run);
  } catch (const Bad& e) {
    throw std::runtime_error(prefix + e.what());
  } catch (const nlohmann::json::exception& e) {
    throw std::runtime_error(prefix + "unexpected config or summary JSON (" + e.what() + ")");
  }
  return run;
}

}  // namespace ddplab
