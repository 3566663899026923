// Writing a result so that it is all-or-nothing: check_output_path() before the work, then write
// `temp_path_for(path)` and publish_file() it.
#pragma once
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <string>

namespace ddplab {

inline std::string temp_path_for(const std::string& path) { return path + ".tmp." + std::to_string(getpid()); }

// Two paths that name one file, whether or not it exists yet ("r.h5", "./r.h5", "x/../r.h5"); false if either is empty.
inline bool same_file(const std::string& a, const std::string& b) {
  if (a.empty() || b.empty()) return false;
  namespace fs = std::filesystem;
  return fs::weakly_canonical(fs::absolute(a)) == fs::weakly_canonical(fs::absolute(b));
}

// Empty when `path` can be written (it is not a folder, it does not exist unless `force`, and the temporary the
// writer will use can be created beside it), otherwise a one-line reason. The temporary is created and removed
// because permission bits cannot tell: access(W_OK) says yes to root on /proc or a read-only mount. Leaves nothing
// behind.
inline std::string check_output_path(const std::string& path, bool force) {
  if (path.empty()) return "output path is empty";
  struct stat st;
  if (stat(path.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode)) return "output path " + path + " is a folder (name a file)";
    if (!force) return "output file " + path + " already exists (pass --force to overwrite)";
  }
  const auto slash = path.find_last_of('/');
  const std::string folder = slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
  if (stat(folder.c_str(), &st) != 0) return "output folder " + folder + " does not exist";
  if (!S_ISDIR(st.st_mode)) return "output folder " + folder + " is not a folder";
  const std::string tmp = temp_path_for(path);
  const int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0644);
  if (fd < 0) return "cannot write " + path + ": creating " + tmp + " failed: " + std::strerror(errno);
  close(fd);
  unlink(tmp.c_str());
  return "";
}

// Moves a complete temporary into place. Without `force`, link() refuses to replace a file that appeared
// meanwhile; with it, rename() replaces atomically. On failure the temporary is removed and this throws.
inline void publish_file(const std::string& tmp, const std::string& path, bool force) {
  const bool ok = force ? std::rename(tmp.c_str(), path.c_str()) == 0 : link(tmp.c_str(), path.c_str()) == 0;
  const int error = errno;
  unlink(tmp.c_str());  // after link(): the temporary name; after a failed rename(): the leftover
  if (!ok) throw std::runtime_error("cannot create " + path + ": " + std::strerror(error));
}

}  // namespace ddplab
