// Small HDF5 writing helpers shared by the run file and the checkpoint.
#pragma once
#include <hdf5.h>

#include <stdexcept>
#include <string>

#include "record/files.h"

namespace ddplab {

// Every HDF5 call goes through this: a negative id or status becomes an exception naming the call.
template <typename T>
T h5(T result, const char* what) {
  if (result < 0) throw std::runtime_error(std::string("HDF5: ") + what + " failed");
  return result;
}

// Strings are variable-length UTF-8, so h5py reads them as str, not bytes.
inline hid_t utf8_string_type() {
  const hid_t type = h5(H5Tcopy(H5T_C_S1), "H5Tcopy");
  h5(H5Tset_size(type, H5T_VARIABLE), "H5Tset_size");
  h5(H5Tset_cset(type, H5T_CSET_UTF8), "H5Tset_cset");
  return type;
}

inline void write_string_attr(hid_t loc, const char* name, const std::string& value) {
  H5Id type(utf8_string_type(), H5Tclose);
  H5Id space(h5(H5Screate(H5S_SCALAR), "H5Screate"), H5Sclose);
  H5Id attr(h5(H5Acreate2(loc, name, type, space, H5P_DEFAULT, H5P_DEFAULT), name), H5Aclose);
  const char* text = value.c_str();
  h5(H5Awrite(attr, type, &text), name);
}

inline void write_int_attr(hid_t loc, const char* name, long long value) {
  H5Id space(h5(H5Screate(H5S_SCALAR), "H5Screate"), H5Sclose);
  H5Id attr(h5(H5Acreate2(loc, name, H5T_NATIVE_LLONG, space, H5P_DEFAULT, H5P_DEFAULT), name), H5Aclose);
  h5(H5Awrite(attr, H5T_NATIVE_LLONG, &value), name);
}

}  // namespace ddplab
