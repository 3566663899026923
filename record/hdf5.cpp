#include "record/hdf5.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "record/files.h"

namespace ddplab {
namespace {

hid_t utf8_string_type() {
  const hid_t type = h5(H5Tcopy(H5T_C_S1), "H5Tcopy");
  h5(H5Tset_size(type, H5T_VARIABLE), "H5Tset_size");
  h5(H5Tset_cset(type, H5T_CSET_UTF8), "H5Tset_cset");
  return type;
}

herr_t keep_innermost(unsigned n, const H5E_error2_t* error, void* out) {
  if (n == 0 && error->desc) *static_cast<std::string*>(out) = error->desc;
  return 0;
}

// The first "errno = N" in the stack, innermost first: where a file driver's system call failed.
herr_t find_errno(unsigned, const H5E_error2_t* error, void* out) {
  const char* at = error->desc ? std::strstr(error->desc, "errno = ") : nullptr;
  int& code = *static_cast<int*>(out);
  if (at && code == 0) code = std::atoi(at + std::strlen("errno = "));
  return 0;
}

std::string cannot_read(const std::string& what) { return "cannot read " + what + " (" + hdf5_reason() + ")"; }

std::vector<hsize_t> dims_of_space(hid_t space, const std::string& what) {
  const int n = H5Sget_simple_extent_ndims(space);
  if (n < 0) throw FileProblem("cannot read the shape of " + what);
  std::vector<hsize_t> dims(n);
  if (n > 0 && H5Sget_simple_extent_dims(space, dims.data(), nullptr) < 0)
    throw FileProblem("cannot read the shape of " + what);
  return dims;
}

// Strings of either HDF5 kind (variable-length, as ddplab writes them, or fixed-length) from an attribute or a
// dataset: `count` of them.
template <bool kIsAttr>
std::vector<std::string> read_string_values(hid_t obj, hid_t file_type, hid_t space, size_t count,
                                            const std::string& what) {
  if (H5Tget_class(file_type) != H5T_STRING) throw FileProblem(what + " is not a string");
  std::vector<std::string> out;
  H5Id mem(H5Tcopy(H5T_C_S1), H5Tclose);
  if (H5Tis_variable_str(file_type) > 0) {
    H5Tset_size(mem, H5T_VARIABLE);
    H5Tset_cset(mem, H5Tget_cset(file_type));
    std::vector<char*> ptrs(count, nullptr);
    const herr_t rc =
        kIsAttr ? H5Aread(obj, mem, ptrs.data()) : H5Dread(obj, mem, H5S_ALL, H5S_ALL, H5P_DEFAULT, ptrs.data());
    if (rc < 0) throw FileProblem(cannot_read(what));
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
    if (rc < 0) throw FileProblem(cannot_read(what));
    for (size_t i = 0; i < count; ++i) out.emplace_back(std::string(buf.data() + i * width, width).c_str());
  }
  return out;
}

// Refuses a dataset that claims more data than the file can hold for it. ddplab's run file is contiguous and
// uncompressed; a chunked dataset (the checkpoint's, or another writer's, maybe compressed) may expand up to
// 1024x, about deflate's limit.
void check_stored(hid_t set, const std::vector<hsize_t>& dims, const std::string& what) {
  H5Id type(H5Dget_type(set), H5Tclose);
  H5Id create(H5Dget_create_plist(set), H5Pclose);
  H5Id file(H5Iget_file_id(set), H5Fclose);
  hsize_t file_size = 0;
  if (!type.ok() || !create.ok() || !file.ok() || H5Fget_filesize(file, &file_size) < 0)
    throw FileProblem(cannot_read(what));
  hsize_t bytes = H5Tget_size(type);
  for (hsize_t d : dims)
    if (__builtin_mul_overflow(bytes, d, &bytes)) throw FileProblem(what + " is too large");
  const hsize_t stored = std::min<hsize_t>(H5Dget_storage_size(set), file_size);
  if (bytes > (H5Pget_layout(create) == H5D_CHUNKED ? stored * 1024 : stored))
    throw FileProblem(what + " claims " + std::to_string(bytes) + " bytes of data, the file holds " +
                      std::to_string(stored));
}

template <typename T>
std::vector<T> read_all(hid_t loc, const char* name, const std::vector<hsize_t>& want, const std::string& what,
                        hid_t mem_type) {
  H5Id set(open_dataset(loc, name, want, what), H5Dclose);
  H5Id type(H5Dget_type(set), H5Tclose);
  const H5T_class_t cls = H5Tget_class(type);
  if (cls != H5T_FLOAT && cls != H5T_INTEGER) throw FileProblem(what + " is not numeric");
  size_t n = 1;
  for (hsize_t d : want) n *= d;
  std::vector<T> out(n);
  if (n > 0 && H5Dread(set, mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, out.data()) < 0)
    throw FileProblem(cannot_read(what));
  return out;
}

void write_dataset(hid_t loc, const char* name, const void* data, bool empty, const std::vector<hsize_t>& dims,
                   hid_t file_type, hid_t mem_type, const char* units) {
  H5Id space(h5(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr), "H5Screate_simple"), H5Sclose);
  H5Id set(h5(H5Dcreate2(loc, name, file_type, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), name), H5Dclose);
  if (!empty) h5(H5Dwrite(set, mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data), name);
  if (units) write_string_attr(set, "units", units);
}

}  // namespace

// ---- writing ----------------------------------------------------------------------------------------------------

hid_t create_group(hid_t loc, const char* name) {
  return h5(H5Gcreate2(loc, name, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), name);
}

void write_string_attr(hid_t loc, const char* name, const std::string& value) {
  H5Id type(utf8_string_type(), H5Tclose);
  H5Id space(h5(H5Screate(H5S_SCALAR), "H5Screate"), H5Sclose);
  H5Id attr(h5(H5Acreate2(loc, name, type, space, H5P_DEFAULT, H5P_DEFAULT), name), H5Aclose);
  const char* text = value.c_str();
  h5(H5Awrite(attr, type, &text), name);
}

void write_int_attr(hid_t loc, const char* name, long long value) {
  H5Id space(h5(H5Screate(H5S_SCALAR), "H5Screate"), H5Sclose);
  H5Id attr(h5(H5Acreate2(loc, name, H5T_STD_I64LE, space, H5P_DEFAULT, H5P_DEFAULT), name), H5Aclose);
  h5(H5Awrite(attr, H5T_NATIVE_LLONG, &value), name);
}

void write_strings(hid_t loc, const char* name, const std::vector<std::string>& values) {
  std::vector<const char*> ptrs;
  for (const auto& v : values) ptrs.push_back(v.c_str());
  H5Id type(utf8_string_type(), H5Tclose);
  const hsize_t dims[1] = {values.size()};
  H5Id space(h5(H5Screate_simple(1, dims, nullptr), "H5Screate_simple"), H5Sclose);
  H5Id set(h5(H5Dcreate2(loc, name, type, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), name), H5Dclose);
  h5(H5Dwrite(set, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, ptrs.data()), name);
}

void write_numbers(hid_t loc, const char* name, const std::vector<double>& data, const std::vector<hsize_t>& dims,
                   hid_t file_type, const char* units) {
  write_dataset(loc, name, data.data(), data.empty(), dims, file_type, H5T_NATIVE_DOUBLE, units);
}

void write_numbers(hid_t loc, const char* name, const std::vector<int64_t>& data, const std::vector<hsize_t>& dims,
                   const char* units) {
  write_dataset(loc, name, data.data(), data.empty(), dims, H5T_STD_I64LE, H5T_NATIVE_INT64, units);
}

// ---- reading ----------------------------------------------------------------------------------------------------

std::string hdf5_os_error() {
  int code = 0;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, find_errno, &code);
  return code > 0 ? std::strerror(code) : "";
}

std::string hdf5_reason() {
  std::string desc;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, keep_innermost, &desc);
  return desc.empty() ? "unknown HDF5 error" : desc;
}

hid_t open_for_reading(const std::string& path) {
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  off_t size = 0;
  if (const std::string problem = input_file_problem(path, &size); !problem.empty()) throw FileProblem(problem);
  if (size == 0) throw FileProblem("empty file (not HDF5)");
  if (H5Fis_hdf5(path.c_str()) <= 0) throw FileProblem("not an HDF5 file");
  const hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  if (file < 0) throw FileProblem("HDF5 cannot open it, damaged or truncated (" + hdf5_reason() + ")");
  return file;
}

std::string shape_text(const std::vector<hsize_t>& dims) {
  std::string s = "[";
  for (size_t i = 0; i < dims.size(); ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
  return s + "]";
}

bool has_attr(hid_t loc, const char* name) { return H5Aexists(loc, name) > 0; }

namespace {

// A single-valued attribute of the given class, opened with its type and space (H5Id is not movable: filled in place).
struct ScalarAttr {
  H5Id attr, type, space;
  ScalarAttr(hid_t loc, const char* name, H5T_class_t kind, const char* kind_name)
      : attr(has_attr(loc, name) ? H5Aopen(loc, name, H5P_DEFAULT) : -1, H5Aclose),
        type(attr.ok() ? H5Aget_type(attr) : -1, H5Tclose),
        space(attr.ok() ? H5Aget_space(attr) : -1, H5Sclose) {
    const std::string what = std::string("attribute ") + name;
    if (!has_attr(loc, name)) throw FileProblem(std::string("no attribute ") + name);
    if (!type.ok() || !space.ok()) throw FileProblem(cannot_read(what));
    if (H5Tget_class(type) != kind || H5Sget_simple_extent_npoints(space) != 1)
      throw FileProblem(what + " is not " + kind_name);
  }
};

}  // namespace

std::string read_string_attr(hid_t loc, const char* name) {
  const ScalarAttr a(loc, name, H5T_STRING, "a string");
  return read_string_values<true>(a.attr, a.type, a.space, 1, std::string("attribute ") + name).front();
}

int64_t read_int_attr(hid_t loc, const char* name, int64_t min, int64_t max) {
  const std::string what = std::string("attribute ") + name;
  const ScalarAttr a(loc, name, H5T_INTEGER, "an integer");
  long long value = 0;
  if (H5Aread(a.attr, H5T_NATIVE_LLONG, &value) < 0) throw FileProblem(cannot_read(what));
  if (value < min || value > max) throw FileProblem(what + " is out of range: " + std::to_string(value));
  return value;
}

bool has_link(hid_t loc, const char* name) { return H5Lexists(loc, name, H5P_DEFAULT) > 0; }

hid_t open_group(hid_t loc, const char* name, const std::string& what) {
  if (!has_link(loc, name)) throw FileProblem("missing group " + what);
  const hid_t group = H5Gopen2(loc, name, H5P_DEFAULT);
  if (group < 0) throw FileProblem(what + " is not a group");
  return group;
}

std::vector<std::string> member_names(hid_t group, const std::string& what) {
  H5G_info_t info;
  if (H5Gget_info(group, &info) < 0) throw FileProblem("cannot list " + what + " (" + hdf5_reason() + ")");
  std::vector<std::string> names;
  for (hsize_t i = 0; i < info.nlinks; ++i) {
    const ssize_t len = H5Lget_name_by_idx(group, ".", H5_INDEX_NAME, H5_ITER_INC, i, nullptr, 0, H5P_DEFAULT);
    if (len < 0) throw FileProblem("cannot list " + what + " (" + hdf5_reason() + ")");
    std::string name(static_cast<size_t>(len) + 1, '\0');
    H5Lget_name_by_idx(group, ".", H5_INDEX_NAME, H5_ITER_INC, i, name.data(), name.size(), H5P_DEFAULT);
    name.resize(static_cast<size_t>(len));
    names.push_back(name);
  }
  return names;
}

std::vector<hsize_t> dataset_dims(hid_t loc, const char* name, const std::string& what) {
  if (!has_link(loc, name)) throw FileProblem("missing dataset " + what);
  H5Id set(H5Dopen2(loc, name, H5P_DEFAULT), H5Dclose);
  H5Id space(set.ok() ? H5Dget_space(set) : -1, H5Sclose);
  if (!space.ok()) throw FileProblem(what + " is not a dataset");
  return dims_of_space(space, what);
}

hid_t open_dataset(hid_t loc, const char* name, const std::vector<hsize_t>& want, const std::string& what) {
  if (!has_link(loc, name)) throw FileProblem("missing dataset " + what);
  H5Id set(H5Dopen2(loc, name, H5P_DEFAULT), H5Dclose);
  if (!set.ok()) throw FileProblem(what + " is not a dataset");
  H5Id space(H5Dget_space(set), H5Sclose);
  const std::vector<hsize_t> dims = space.ok() ? dims_of_space(space, what) : std::vector<hsize_t>{};
  if (dims != want) throw FileProblem(what + " has shape " + shape_text(dims) + ", expected " + shape_text(want));
  check_stored(set, dims, what);
  return set.release();
}

std::vector<double> read_doubles(hid_t loc, const char* name, const std::vector<hsize_t>& want,
                                 const std::string& what) {
  return read_all<double>(loc, name, want, what, H5T_NATIVE_DOUBLE);
}

std::vector<int64_t> read_int64s(hid_t loc, const char* name, const std::vector<hsize_t>& want,
                                 const std::string& what) {
  return read_all<int64_t>(loc, name, want, what, H5T_NATIVE_INT64);
}

std::vector<std::string> read_strings(hid_t loc, const char* name, hsize_t count, const std::string& what) {
  H5Id set(open_dataset(loc, name, {count}, what), H5Dclose);
  H5Id type(H5Dget_type(set), H5Tclose);
  H5Id space(H5Dget_space(set), H5Sclose);
  return read_string_values<false>(set, type, space, count, what);
}

}  // namespace ddplab
