#include "record/checkpoint.h"

#include <fcntl.h>
#include <hdf5.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <stdexcept>
#include <utility>

#include "git_commit.h"
#include "record/errors.h"
#include "record/files.h"
#include "record/h5util.h"
#include "record/version.h"
#include "record/run_file.h"

namespace ddplab {
namespace {

constexpr const char* kFormat = "ddplab-checkpoint";
// Elements per chunk along a tensor's first dimension. Chunking is what lets HDF5 keep a Fletcher-32 checksum
// per chunk, so a damaged byte in the data fails the read instead of loading silently.
constexpr hsize_t kChunkElements = hsize_t{1} << 20;

// A problem with the file; load_checkpoint() turns it into a UsageError naming the file.
struct Bad : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// The optimizer's state tensors, each a group under /optimizer: the first names first_moment(), the second
// second_moment().
std::vector<std::string> state_groups(const OptimizerConfig& config) {
  if (config.kind == "adamw") return {"exp_avg", "exp_avg_sq"};
  if (config.momentum != 0.0f) return {"momentum"};
  return {};
}

// Elements of the flat buffers the parameters lie in; the optimizer's state, if it keeps any, has the same size.
size_t flat_size(const std::vector<Parameter<float>>& params, const Optimizer<float>& opt) {
  int64_t n = 0;
  for (const auto& p : params) n = std::max(n, p.offset + p.numel);
  if (!opt.first_moment().empty() && opt.first_moment().size() != static_cast<size_t>(n))
    throw std::invalid_argument("checkpoint: the parameters do not match the optimizer's size");
  return static_cast<size_t>(n);
}

std::string shape_text(const std::vector<hsize_t>& dims) {
  std::string s = "[";
  for (size_t i = 0; i < dims.size(); ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
  return s + "]";
}

std::vector<hsize_t> dims_of(const Parameter<float>& p) { return {p.shape.begin(), p.shape.end()}; }

// The innermost message on HDF5's error stack: the cause ("truncated file: eof = ..."), not the API call.
herr_t keep_innermost(unsigned n, const H5E_error2_t* error, void* out) {
  if (n == 0 && error->desc) *static_cast<std::string*>(out) = error->desc;
  return 0;
}

std::string hdf5_reason() {
  std::string desc;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, keep_innermost, &desc);
  return desc.empty() ? "unknown HDF5 error" : desc;
}

// ---- saving -----------------------------------------------------------------------------------------------------

void write_tensors(hid_t loc, const std::string& group_name, const std::vector<Parameter<float>>& params,
                   const float* flat) {
  H5Id group(h5(H5Gcreate2(loc, group_name.c_str(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), group_name.c_str()),
             H5Gclose);
  for (const Parameter<float>& p : params) {
    const std::string what = "write " + group_name + "/" + p.name;
    const std::vector<hsize_t> dims = dims_of(p);
    H5Id space(h5(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr), what.c_str()), H5Sclose);
    std::vector<hsize_t> chunk = dims;
    if (!chunk.empty()) {
      hsize_t row = 1;
      for (size_t d = 1; d < dims.size(); ++d) row *= dims[d];
      chunk[0] = std::min(dims[0], std::max<hsize_t>(1, kChunkElements / std::max<hsize_t>(row, 1)));
    }
    H5Id create(h5(H5Pcreate(H5P_DATASET_CREATE), what.c_str()), H5Pclose);
    h5(H5Pset_chunk(create, static_cast<int>(chunk.size()), chunk.data()), what.c_str());
    h5(H5Pset_fletcher32(create), what.c_str());
    H5Id set(
        h5(H5Dcreate2(group, p.name.c_str(), H5T_IEEE_F32LE, space, H5P_DEFAULT, create, H5P_DEFAULT), what.c_str()),
        H5Dclose);
    h5(H5Dwrite(set, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, flat + p.offset), what.c_str());
  }
}

void write_contents(hid_t file, const std::vector<Parameter<float>>& params, const float* flat_params,
                    const Optimizer<float>& opt, const CheckpointInfo& info) {
  write_string_attr(file, "format", kFormat);
  write_int_attr(file, "format_version", kCheckpointFormatVersion);
  write_int_attr(file, "step", info.step);
  write_string_attr(file, "optimizer", opt.config().kind);
  write_int_attr(file, "optimizer_steps", opt.steps_taken());
  write_string_attr(file, "config", info.config_json);
  write_string_attr(file, "git_commit", DDPLAB_GIT_COMMIT);
  write_string_attr(file, "ddplab_version", kVersion);
  write_tensors(file, "params", params, flat_params);
  H5Id optimizer(h5(H5Gcreate2(file, "optimizer", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), "create optimizer"),
                 H5Gclose);
  const std::vector<std::string> groups = state_groups(opt.config());
  for (size_t i = 0; i < groups.size(); ++i)
    write_tensors(optimizer, groups[i], params, (i == 0 ? opt.first_moment() : opt.second_moment()).data());
}

// HDF5 does not fsync: without this a crash soon after the rename could leave an empty file under the real name.
void sync_to_disk(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY);
  const bool ok = fd >= 0 && fsync(fd) == 0;
  const int error = errno;
  if (fd >= 0) close(fd);
  if (!ok) throw std::runtime_error("cannot sync " + path + " to disk: " + std::strerror(error));
}

// ---- loading ----------------------------------------------------------------------------------------------------

std::string read_string_attr(hid_t loc, const char* name) {
  if (H5Aexists(loc, name) <= 0) throw Bad(std::string("no attribute ") + name);
  H5Id attr(H5Aopen(loc, name, H5P_DEFAULT), H5Aclose);
  H5Id type(H5Aget_type(attr), H5Tclose);
  H5Id space(H5Aget_space(attr), H5Sclose);
  if (H5Tget_class(type) != H5T_STRING || H5Tis_variable_str(type) <= 0 || H5Sget_simple_extent_npoints(space) != 1)
    throw Bad(std::string("attribute ") + name + " is not a string");
  H5Id mem(H5Tcopy(H5T_C_S1), H5Tclose);
  char* text = nullptr;
  if (H5Tset_size(mem, H5T_VARIABLE) < 0 || H5Tset_cset(mem, H5Tget_cset(type)) < 0 || H5Aread(attr, mem, &text) < 0)
    throw Bad(std::string("cannot read attribute ") + name + " (" + hdf5_reason() + ")");
  const std::string value = text ? text : "";
  H5free_memory(text);
  return value;
}

int64_t read_int_attr(hid_t loc, const char* name, int64_t min, int64_t max) {
  if (H5Aexists(loc, name) <= 0) throw Bad(std::string("no attribute ") + name);
  H5Id attr(H5Aopen(loc, name, H5P_DEFAULT), H5Aclose);
  H5Id type(H5Aget_type(attr), H5Tclose);
  H5Id space(H5Aget_space(attr), H5Sclose);
  if (H5Tget_class(type) != H5T_INTEGER || H5Sget_simple_extent_npoints(space) != 1)
    throw Bad(std::string("attribute ") + name + " is not an integer");
  long long value = 0;
  if (H5Aread(attr, H5T_NATIVE_LLONG, &value) < 0)
    throw Bad(std::string("cannot read attribute ") + name + " (" + hdf5_reason() + ")");
  if (value < min || value > max)
    throw Bad(std::string("attribute ") + name + " is out of range: " + std::to_string(value));
  return value;
}

// Opens `name` under `loc` as a group; `what` is its path in messages.
hid_t open_group(hid_t loc, const std::string& name, const std::string& what) {
  if (H5Lexists(loc, name.c_str(), H5P_DEFAULT) <= 0) throw Bad("missing group " + what);
  const hid_t group = H5Gopen2(loc, name.c_str(), H5P_DEFAULT);
  if (group < 0) throw Bad(what + " is not a group");
  return group;
}

// Every link directly under `group`, in name order.
std::vector<std::string> member_names(hid_t group, const std::string& what) {
  H5G_info_t info;
  if (H5Gget_info(group, &info) < 0) throw Bad("cannot list " + what + " (" + hdf5_reason() + ")");
  std::vector<std::string> names;
  for (hsize_t i = 0; i < info.nlinks; ++i) {
    const ssize_t len = H5Lget_name_by_idx(group, ".", H5_INDEX_NAME, H5_ITER_INC, i, nullptr, 0, H5P_DEFAULT);
    if (len < 0) throw Bad("cannot list " + what + " (" + hdf5_reason() + ")");
    std::string name(static_cast<size_t>(len) + 1, '\0');
    H5Lget_name_by_idx(group, ".", H5_INDEX_NAME, H5_ITER_INC, i, name.data(), name.size(), H5P_DEFAULT);
    name.resize(static_cast<size_t>(len));
    names.push_back(name);
  }
  return names;
}

// Refuses a group whose members are not exactly `expected`, naming the first one missing or unexpected.
void require_members(hid_t group, const std::string& what, const std::vector<std::string>& expected,
                     const std::string& kind, const std::string& why_unexpected) {
  const std::vector<std::string> present = member_names(group, what);
  for (const std::string& name : expected)
    if (std::find(present.begin(), present.end(), name) == present.end())
      throw Bad("missing " + kind + " " + what + "/" + name);
  for (const std::string& name : present)
    if (std::find(expected.begin(), expected.end(), name) == expected.end())
      throw Bad("unexpected " + kind + " " + what + "/" + name + " (" + why_unexpected + ")");
}

std::string dtype_text(hid_t type) {
  const std::string bits = std::to_string(8 * H5Tget_size(type));
  switch (H5Tget_class(type)) {
    case H5T_FLOAT:
      return "float" + bits;
    case H5T_INTEGER:
      return (H5Tget_sign(type) == H5T_SGN_NONE ? "uint" : "int") + bits;
    case H5T_STRING:
      return "string";
    default:
      return "of a non-numeric type";
  }
}

// Reads what/<p.name> for every parameter into flat (at each parameter's offset), checking dtype and shape.
void read_tensors(hid_t loc, const std::string& group_name, const std::string& what,
                  const std::vector<Parameter<float>>& params, float* flat) {
  H5Id group(open_group(loc, group_name, what), H5Gclose);
  std::vector<std::string> names;
  for (const auto& p : params) names.push_back(p.name);
  require_members(group, what, names, "tensor", "the model has no such parameter");
  for (const Parameter<float>& p : params) {
    const std::string where = what + "/" + p.name;
    H5Id set(H5Dopen2(group, p.name.c_str(), H5P_DEFAULT), H5Dclose);
    if (!set.ok()) throw Bad(where + " is not a dataset");
    H5Id type(H5Dget_type(set), H5Tclose);
    if (H5Tget_class(type) != H5T_FLOAT || H5Tget_size(type) != 4)
      throw Bad(where + " is " + dtype_text(type) + ", expected float32");
    H5Id space(H5Dget_space(set), H5Sclose);
    const int rank = H5Sget_simple_extent_ndims(space);
    if (rank < 0) throw Bad("cannot read the shape of " + where);
    std::vector<hsize_t> dims(rank);
    H5Sget_simple_extent_dims(space, dims.data(), nullptr);
    if (dims != dims_of(p))
      throw Bad(where + " has shape " + shape_text(dims) + ", expected " + shape_text(dims_of(p)));
    // A damaged layout message can claim chunks larger than the tensor; libhdf5 1.10 then allocates the claimed
    // chunk (up to 4 GiB) and copies past its own buffers. save_checkpoint() never writes such chunks.
    H5Id create(H5Dget_create_plist(set), H5Pclose);
    if (!create.ok()) throw Bad("cannot read the layout of " + where);
    if (H5Pget_layout(create) == H5D_CHUNKED) {
      std::vector<hsize_t> chunk(rank);
      if (H5Pget_chunk(create, rank, chunk.data()) != rank) throw Bad("cannot read the chunks of " + where);
      hsize_t most_bytes = 4;  // a chunk's floats
      for (int d = 0; d < rank; ++d) {
        if (chunk[d] > dims[d]) throw Bad(where + " has chunks " + shape_text(chunk) + " larger than the tensor");
        most_bytes *= chunk[d];
      }
      most_bytes += 4;  // and its Fletcher-32 checksum
      // Likewise a damaged chunk index can claim a huge stored size, which libhdf5 allocates before reading.
      H5Id file_space(H5Dget_space(set), H5Sclose);
      hsize_t chunks = 0;
      if (H5Dget_num_chunks(set, file_space, &chunks) < 0) throw Bad("cannot read the chunks of " + where);
      for (hsize_t i = 0; i < chunks; ++i) {
        hsize_t offset[H5S_MAX_RANK], bytes = 0;
        haddr_t address = 0;
        unsigned filters = 0;
        if (H5Dget_chunk_info(set, file_space, i, offset, &filters, &address, &bytes) < 0 || bytes > most_bytes)
          throw Bad(where + " has a damaged chunk index");
      }
    }
    if (H5Dread(set, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, flat + p.offset) < 0)
      throw Bad("cannot read " + where + " (" + hdf5_reason() + ")");
  }
}

// Validates and reads everything into staging copies first, so that a bad file changes nothing.
CheckpointInfo read_contents(hid_t file, const std::vector<Parameter<float>>& params, float* flat_params,
                             Optimizer<float>& opt) {
  if (H5Aexists(file, "format") <= 0) throw Bad("no format attribute (not a ddplab checkpoint)");
  const std::string format = read_string_attr(file, "format");
  if (format != kFormat) throw Bad("format is '" + format + "', expected '" + kFormat + "'");
  const int64_t version = read_int_attr(file, "format_version", 0, INT_MAX);
  if (version != kCheckpointFormatVersion)
    throw Bad("format version " + std::to_string(version) + ", this ddplab reads version " +
              std::to_string(kCheckpointFormatVersion));
  const std::string kind = read_string_attr(file, "optimizer");
  if (kind != opt.config().kind)
    throw Bad("optimizer " + kind + " in the checkpoint, this run uses " + opt.config().kind);
  CheckpointInfo info;
  info.step = read_int_attr(file, "step", 0, INT64_MAX);
  const int optimizer_steps = static_cast<int>(read_int_attr(file, "optimizer_steps", 0, INT_MAX));
  info.config_json = read_string_attr(file, "config");
  info.git_commit = read_string_attr(file, "git_commit");
  info.ddplab_version = read_string_attr(file, "ddplab_version");

  const size_t n = flat_size(params, opt);
  std::vector<float> staged(flat_params, flat_params + n);
  read_tensors(file, "params", "params", params, staged.data());
  H5Id optimizer(open_group(file, "optimizer", "optimizer"), H5Gclose);
  const std::vector<std::string> groups = state_groups(opt.config());
  require_members(optimizer, "optimizer", groups, "optimizer state", "this run's optimizer keeps no such state");
  std::vector<float> m = opt.first_moment(), v = opt.second_moment();
  for (size_t i = 0; i < groups.size(); ++i)
    read_tensors(optimizer, groups[i], "optimizer/" + groups[i], params, (i == 0 ? m : v).data());

  std::copy(staged.begin(), staged.end(), flat_params);
  opt.restore(optimizer_steps, std::move(m), std::move(v));
  return info;
}

}  // namespace

void save_checkpoint(const std::string& path, bool force, const std::vector<Parameter<float>>& params,
                     const float* flat_params, const Optimizer<float>& opt, const CheckpointInfo& info) {
  for (const auto& p : params)
    if (p.name.empty() || p.name == "." || p.name.find('/') != std::string::npos)
      throw std::invalid_argument("checkpoint: parameter name '" + p.name + "' cannot be an HDF5 dataset name");
  flat_size(params, opt);  // throws if the parameters and the optimizer disagree
  const std::string prefix = "cannot save checkpoint " + path + ": ";
  if (const std::string problem = check_output_path(path, force); !problem.empty())
    throw std::runtime_error("cannot save checkpoint: " + problem);
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);  // our exceptions carry the message; no HDF5 stack dumps
  const std::string tmp = temp_path_for(path);
  try {
    {
      H5Id file(h5(H5Fcreate(tmp.c_str(), H5F_ACC_EXCL, H5P_DEFAULT, H5P_DEFAULT), ("create " + tmp).c_str()),
                H5Fclose);
      write_contents(file, params, flat_params, opt, info);
      h5(H5Fflush(file, H5F_SCOPE_GLOBAL), "flush");
    }
    sync_to_disk(tmp);
  } catch (const std::exception& e) {
    unlink(tmp.c_str());
    throw std::runtime_error(prefix + e.what());
  }
  publish_file(tmp, path, force);
}

CheckpointInfo load_checkpoint(const std::string& path, const std::vector<Parameter<float>>& params, float* flat_params,
                               Optimizer<float>& opt) {
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);  // our one-line errors replace HDF5's stack dumps
  const std::string prefix = "cannot load checkpoint " + path + ": ";
  struct stat st;
  if (stat(path.c_str(), &st) != 0) throw UsageError(prefix + std::strerror(errno));
  if (S_ISDIR(st.st_mode)) throw UsageError(prefix + "is a folder");
  if (st.st_size == 0) throw UsageError(prefix + "empty file (not HDF5)");
  if (H5Fis_hdf5(path.c_str()) <= 0) throw UsageError(prefix + "not an HDF5 file");
  H5Id file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  if (!file.ok()) throw UsageError(prefix + "HDF5 cannot open it, damaged or truncated (" + hdf5_reason() + ")");
  return load_checkpoint(file, path, params, flat_params, opt);
}

CheckpointInfo load_checkpoint(hid_t file, const std::string& path, const std::vector<Parameter<float>>& params,
                               float* flat_params, Optimizer<float>& opt) {
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  const std::string prefix = "cannot load checkpoint " + path + ": ";
  try {
    return read_contents(file, params, flat_params, opt);
  } catch (const Bad& e) {
    throw UsageError(prefix + e.what());
  }
}

}  // namespace ddplab
