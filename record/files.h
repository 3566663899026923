// Writing a result so that it is all-or-nothing: write `temp_path_for(path)`, then publish_file() it.
#pragma once
#include <hdf5.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>

namespace ddplab {

inline std::string temp_path_for(const std::string& path) { return path + ".tmp." + std::to_string(getpid()); }

// Moves a complete temporary into place. Without `force`, link() refuses to replace a file that appeared
// meanwhile; with it, rename() replaces atomically. On failure the temporary is removed and this throws.
inline void publish_file(const std::string& tmp, const std::string& path, bool force) {
  const bool ok = force ? std::rename(tmp.c_str(), path.c_str()) == 0 : link(tmp.c_str(), path.c_str()) == 0;
  const int error = errno;
  unlink(tmp.c_str());  // after link(): the temporary name; after a failed rename(): the leftover
  if (!ok) throw std::runtime_error("cannot create " + path + ": " + std::strerror(error));
}

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

 private:
  hid_t id_;
  herr_t (*close_)(hid_t);
};

}  // namespace ddplab
