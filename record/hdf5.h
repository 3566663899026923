// The HDF5 helpers behind every file ddplab writes and reads back (the run file, the checkpoint): one RAII
// handle, one error check for writing, and readers that validate as they go, so a damaged or hostile file ends
// in a FileProblem naming what is wrong instead of a crash, a hang on a huge allocation, or a silent zero.
#pragma once
#include <hdf5.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace ddplab {

// RAII for HDF5 identifiers: the closer matches the kind of object (H5Fclose, H5Dclose, ...).
class H5Id {
 public:
  H5Id(hid_t id, herr_t (*close)(hid_t)) : id_(id), close_(close) {}
  ~H5Id() {
    if (id_ >= 0) close_(id_);
  }
  H5Id(const H5Id&) = delete;
  H5Id& operator=(const H5Id&) = delete;
  operator hid_t() const { return id_; }
  bool ok() const { return id_ >= 0; }
  // Hands the identifier to the caller, who closes it.
  hid_t release() {
    const hid_t id = id_;
    id_ = -1;
    return id;
  }

 private:
  hid_t id_;
  herr_t (*close_)(hid_t);
};

// ---- writing: every call goes through h5(), which turns a failure into an exception: the operating system's
// reason where HDF5 met one ("No space left on device"), else the call that failed ------------------------------

// The operating system's reason behind the last HDF5 failure (HDF5 records the errno of a failed open, read or
// write in its error stack), "" if the failure was not the system's.
std::string hdf5_os_error();

template <typename T>
T h5(T result, const char* what) {
  if (result >= 0) return result;
  const std::string os = hdf5_os_error();
  throw std::runtime_error(os.empty() ? std::string("HDF5: ") + what + " failed" : os);
}

hid_t create_group(hid_t loc, const char* name);
// Strings are variable-length UTF-8, so h5py reads them as str, not bytes.
void write_string_attr(hid_t loc, const char* name, const std::string& value);
void write_int_attr(hid_t loc, const char* name, long long value);
void write_strings(hid_t loc, const char* name, const std::vector<std::string>& values);
// A contiguous dataset of any rank from a flat row-major array of doubles, stored as `file_type`
// (H5T_IEEE_F64LE, H5T_STD_I64LE, ...); `units`, if any, as an attribute.
void write_numbers(hid_t loc, const char* name, const std::vector<double>& data, const std::vector<hsize_t>& dims,
                   hid_t file_type, const char* units);
void write_numbers(hid_t loc, const char* name, const std::vector<int64_t>& data, const std::vector<hsize_t>& dims,
                   const char* units);

// ---- reading: each helper throws FileProblem with one line; the caller prefixes the file's name -------------

struct FileProblem : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// HDF5's own reason for the last failure, innermost first ("truncated file: eof = ..."), not the API call.
std::string hdf5_reason();
// Opens `path` read-only after the checks that give a plain reason: missing, a folder, empty, not HDF5.
// Also switches off HDF5's error printing: our one-line messages replace its stack dumps.
hid_t open_for_reading(const std::string& path);
std::string shape_text(const std::vector<hsize_t>& dims);

// Attributes of `loc`; a string may be variable- or fixed-length. An integer outside [min, max] is refused.
bool has_attr(hid_t loc, const char* name);
std::string read_string_attr(hid_t loc, const char* name);
int64_t read_int_attr(hid_t loc, const char* name, int64_t min = INT64_MIN, int64_t max = INT64_MAX);

bool has_link(hid_t loc, const char* name);
// `what` names the object in messages (its path in the file).
hid_t open_group(hid_t loc, const char* name, const std::string& what);
// Every link directly under `group`, in name order.
std::vector<std::string> member_names(hid_t group, const std::string& what);
// The dims of dataset `name`, which must exist.
std::vector<hsize_t> dataset_dims(hid_t loc, const char* name, const std::string& what);
// Opens dataset `name` after checking that its dims are `want` and that the file holds the data it claims: a
// damaged file can declare 2^32 elements with nothing behind them, and the reader would allocate for the claim.
hid_t open_dataset(hid_t loc, const char* name, const std::vector<hsize_t>& want, const std::string& what);
// The whole dataset (of dims `want`, any numeric type) converted to double or int64.
std::vector<double> read_doubles(hid_t loc, const char* name, const std::vector<hsize_t>& want,
                                 const std::string& what);
std::vector<int64_t> read_int64s(hid_t loc, const char* name, const std::vector<hsize_t>& want,
                                 const std::string& what);
std::vector<std::string> read_strings(hid_t loc, const char* name, hsize_t count, const std::string& what);

}  // namespace ddplab
