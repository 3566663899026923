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
#include "record/files.h"
#include "record/hdf5.h"
#include "record/version.h"
#include "runtime/errors.h"

namespace ddplab {
namespace {

constexpr const char* kFormat = "ddplab-checkpoint";
// Elements per chunk along a tensor's first dimension. Chunking is what lets HDF5 keep a Fletcher-32 checksum
// per chunk, so a damaged byte in the data fails the read instead of loading silently.
constexpr hsize_t kChunkElements = hsize_t{1} << 20;

// The optimizer's state tensors, each a group under /optimizer: the first names first_moment(), the second
// second_moment().
std::vector<std::string> state_groups(const OptimizerConfig& config) {
  if (config.kind == OptimizerKind::kAdamW) return {"exp_avg", "exp_avg_sq"};
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

std::vector<hsize_t> dims_of(const Parameter<float>& p) { return {p.shape.begin(), p.shape.end()}; }

// ---- saving -----------------------------------------------------------------------------------------------------

void write_tensors(hid_t loc, const std::string& group_name, const std::vector<Parameter<float>>& params,
                   const float* flat) {
  H5Id group(create_group(loc, group_name.c_str()), H5Gclose);
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
  write_string_attr(file, "optimizer", to_string(opt.config().kind));
  write_int_attr(file, "optimizer_steps", opt.steps_taken());
  write_string_attr(file, "config", info.config_json);
  write_string_attr(file, "git_commit", DDPLAB_GIT_COMMIT);
  write_string_attr(file, "ddplab_version", kVersion);
  write_tensors(file, "params", params, flat_params);
  H5Id optimizer(create_group(file, "optimizer"), H5Gclose);
  const std::vector<std::string> groups = state_groups(opt.config());
  for (size_t i = 0; i < groups.size(); ++i)
    write_tensors(optimizer, groups[i], params, (i == 0 ? opt.first_moment() : opt.second_moment()).data());
}

// ---- loading ----------------------------------------------------------------------------------------------------

// Refuses a group whose members are not exactly `expected`, naming the first one missing or unexpected.
void require_members(hid_t group, const std::string& what, const std::vector<std::string>& expected,
                     const std::string& kind, const std::string& why_unexpected) {
  const std::vector<std::string> present = member_names(group, what);
  for (const std::string& name : expected)
    if (std::find(present.begin(), present.end(), name) == present.end())
      throw FileProblem("missing " + kind + " " + what + "/" + name);
  for (const std::string& name : present)
    if (std::find(expected.begin(), expected.end(), name) == expected.end())
      throw FileProblem("unexpected " + kind + " " + what + "/" + name + " (" + why_unexpected + ")");
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
  H5Id group(open_group(loc, group_name.c_str(), what), H5Gclose);
  std::vector<std::string> names;
  for (const auto& p : params) names.push_back(p.name);
  require_members(group, what, names, "tensor", "the model has no such parameter");
  for (const Parameter<float>& p : params) {
    const std::string where = what + "/" + p.name;
    const std::vector<hsize_t> dims = dims_of(p);
    const int rank = static_cast<int>(dims.size());
    H5Id set(open_dataset(group, p.name.c_str(), dims, where), H5Dclose);
    H5Id type(H5Dget_type(set), H5Tclose);
    if (H5Tget_class(type) != H5T_FLOAT || H5Tget_size(type) != 4)
      throw FileProblem(where + " is " + dtype_text(type) + ", expected float32");
    // A damaged layout message can claim chunks larger than the tensor; libhdf5 1.10 then allocates the claimed
    // chunk (up to 4 GiB) and copies past its own buffers. save_checkpoint() never writes such chunks.
    H5Id create(H5Dget_create_plist(set), H5Pclose);
    if (!create.ok()) throw FileProblem("cannot read the layout of " + where);
    if (H5Pget_layout(create) == H5D_CHUNKED) {
      std::vector<hsize_t> chunk(rank);
      if (H5Pget_chunk(create, rank, chunk.data()) != rank) throw FileProblem("cannot read the chunks of " + where);
      hsize_t most_bytes = 4;  // a chunk's floats
      for (int d = 0; d < rank; ++d) {
        if (chunk[d] > dims[d])
          throw FileProblem(where + " has chunks " + shape_text(chunk) + " larger than the tensor");
        most_bytes *= chunk[d];
      }
      most_bytes += 4;  // and its Fletcher-32 checksum
      // Likewise a damaged chunk index can claim a huge stored size, which libhdf5 allocates before reading.
      H5Id file_space(H5Dget_space(set), H5Sclose);
      hsize_t chunks = 0;
      if (H5Dget_num_chunks(set, file_space, &chunks) < 0) throw FileProblem("cannot read the chunks of " + where);
      for (hsize_t i = 0; i < chunks; ++i) {
        hsize_t offset[H5S_MAX_RANK], bytes = 0;
        haddr_t address = 0;
        unsigned filters = 0;
        if (H5Dget_chunk_info(set, file_space, i, offset, &filters, &address, &bytes) < 0 || bytes > most_bytes)
          throw FileProblem(where + " has a damaged chunk index");
      }
    }
    if (H5Dread(set, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, flat + p.offset) < 0)
      throw FileProblem("cannot read " + where + " (" + hdf5_reason() + ")");
  }
}

// Validates and reads everything into staging copies first, so that a bad file changes nothing.
CheckpointInfo read_contents(hid_t file, const std::vector<Parameter<float>>& params, float* flat_params,
                             Optimizer<float>& opt) {
  if (!has_attr(file, "format")) throw FileProblem("no format attribute (not a ddplab checkpoint)");
  const std::string format = read_string_attr(file, "format");
  if (format != kFormat) throw FileProblem("format is '" + format + "', expected '" + kFormat + "'");
  const int64_t version = read_int_attr(file, "format_version", 0, INT_MAX);
  if (version != kCheckpointFormatVersion)
    throw FileProblem("format version " + std::to_string(version) + ", this ddplab reads version " +
                      std::to_string(kCheckpointFormatVersion));
  const std::string kind = read_string_attr(file, "optimizer");
  if (kind != to_string(opt.config().kind))
    throw FileProblem("optimizer " + kind + " in the checkpoint, this run uses " + to_string(opt.config().kind));
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
      h5(H5Fclose(file.release()), "close");  // its failure too: the file is published only once whole
    }
    sync_to_disk(tmp);
  } catch (const std::exception& e) {
    unlink(tmp.c_str());
    throw std::runtime_error(prefix + e.what());
  }
  publish_file(tmp, path, force);
}

uint64_t checkpoint_data_bytes(int64_t params, const OptimizerConfig& optimizer) {
  return static_cast<uint64_t>(params) * sizeof(float) * (1 + state_groups(optimizer).size());
}

CheckpointInfo load_checkpoint(const std::string& path, const std::vector<Parameter<float>>& params, float* flat_params,
                               Optimizer<float>& opt) {
  hid_t id = -1;
  try {
    id = open_for_reading(path);
  } catch (const FileProblem& e) {
    throw UsageError("cannot load checkpoint " + path + ": " + e.what());
  }
  H5Id file(id, H5Fclose);
  return load_checkpoint(file, path, params, flat_params, opt);
}

std::optional<std::string> checkpoint_config_json(const std::string& path) {
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  try {
    H5Id file(open_for_reading(path), H5Fclose);
    if (!has_attr(file, "format") || read_string_attr(file, "format") != kFormat || !has_attr(file, "config"))
      return std::nullopt;
    return read_string_attr(file, "config");
  } catch (const FileProblem&) {
    return std::nullopt;
  }
}

CheckpointInfo load_checkpoint(hid_t file, const std::string& path, const std::vector<Parameter<float>>& params,
                               float* flat_params, Optimizer<float>& opt) {
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  const std::string prefix = "cannot load checkpoint " + path + ": ";
  try {
    return read_contents(file, params, flat_params, opt);
  } catch (const FileProblem& e) {
    throw UsageError(prefix + e.what());
  }
}

}  // namespace ddplab
