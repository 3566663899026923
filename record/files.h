// Writing a result so that it is all-or-nothing: check_output_path() and check_free_space() before the work, then
// write `temp_path_for(path)`, sync_to_disk() and publish_file() it.
#pragma once
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "runtime/errors.h"

namespace ddplab {

// The temporary beside `path` that a whole-or-nothing write goes through: the pid and a random part, so that the
// stale temporary of an earlier process with this pid (containers repeat pids) never takes the name. Each call
// gives another name, of the same length.
inline std::string temp_path_for(const std::string& path) {
  static thread_local std::mt19937_64 random_bits{std::random_device{}()};
  char part[17];
  std::snprintf(part, sizeof part, "%016llx", static_cast<unsigned long long>(random_bits()));
  return path + ".tmp." + std::to_string(getpid()) + "-" + part;
}

// Two paths that name one file, whether or not it exists yet ("r.h5", "./r.h5", "x/../r.h5"); false if either is empty.
// A path the file system cannot resolve (a loop of symbolic links, a name too long) is compared as written, made
// absolute and normal: the check that writes or reads it then says what is wrong with it.
inline bool same_file(const std::string& a, const std::string& b) {
  if (a.empty() || b.empty()) return false;
  namespace fs = std::filesystem;
  const auto resolved = [](const std::string& path) {
    std::error_code error;
    const fs::path absolute = fs::absolute(path, error);
    if (error) return fs::path(path).lexically_normal();
    fs::path canonical = fs::weakly_canonical(absolute, error);
    return error ? absolute.lexically_normal() : canonical;
  };
  return resolved(a) == resolved(b);
}

// The folder a file is (to be) in.
inline std::string folder_of(const std::string& path) {
  const auto slash = path.find_last_of('/');
  return slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
}

// Empty when `path` names a regular file to read, otherwise why not: looked at before it is opened, since opening a
// pipe waits for a writer and reading /dev/zero never ends. Its size goes to *size, for the reader's own limits.
inline std::string input_file_problem(const std::string& path, off_t* size = nullptr) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) return std::strerror(errno);
  if (S_ISDIR(st.st_mode)) return "is a folder";
  if (!S_ISREG(st.st_mode)) return "is not a regular file (a pipe or a device)";
  if (size) *size = st.st_size;
  return "";
}

// Empty when `path` can be written (a regular file or a free name, not a folder, a device, a pipe or a link; taken
// only with `force`; and the temporary the writer will use can be created beside it), otherwise a one-line reason.
// The temporary is created and removed because permission bits cannot tell: access(W_OK) says yes to root on /proc
// or a read-only mount. Leaves nothing behind.
inline std::string check_output_path(const std::string& path, bool force) {
  if (path.empty()) return "output path is empty";
  struct stat st;
  // lstat: the name itself, not what a link points to (a link to nothing is a name already taken).
  if (lstat(path.c_str(), &st) == 0) {
    const mode_t own = st.st_mode;
    if (stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode))
      return "output path " + path + " is a folder (name a file)";
    // The finished file is renamed over the name: a device (/dev/null, /dev/stdout's link, for root), a pipe or a
    // link must not become a plain file, --force or not.
    if (!S_ISREG(own))
      return "output path " + path + " is " +
             (S_ISLNK(own)                   ? "a symbolic link"
              : S_ISFIFO(own)                ? "a pipe"
              : S_ISCHR(own) || S_ISBLK(own) ? "a device"
                                             : "not a regular file") +
             ", which the written file would replace: name a regular file";
    if (!force) return "output file " + path + " already exists (pass --force to overwrite)";
  }
  const std::string folder = folder_of(path);
  if (stat(folder.c_str(), &st) != 0)
    return "output folder " + folder + (errno == ENOENT ? " does not exist" : std::string(": ") + std::strerror(errno));
  if (!S_ISDIR(st.st_mode)) return "output folder " + folder + " is not a folder";
  const std::string tmp = temp_path_for(path);
  const int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0644);
  if (fd < 0) return "cannot write " + path + ": creating " + tmp + " failed: " + std::strerror(errno);
  close(fd);
  unlink(tmp.c_str());
  return "";
}

// check_output_path, and the output is none of the files the command reads: --force replaces an output, never an
// input.
inline std::string check_output_path(const std::string& path, bool force, const std::vector<std::string>& inputs) {
  for (const std::string& input : inputs)
    if (same_file(path, input)) return "output " + path + " is " + input + ", which this command reads: name another";
  return check_output_path(path, force);
}

// "20.0 KiB", "3.1 MiB".
inline std::string bytes_text(uint64_t bytes) {
  const char* units[] = {"bytes", "KiB", "MiB", "GiB", "TiB"};
  double value = static_cast<double>(bytes);
  int u = 0;
  while (value >= 1024 && u < 4) value /= 1024, ++u;
  char text[32];
  std::snprintf(text, sizeof text, u == 0 ? "%.0f %s" : "%.1f %s", value, units[u]);
  return text;
}

// Empty when the file system of each file has room for the bytes it is to hold (files on one file system add
// up), otherwise one line naming the file, what its file system must hold and what it has free. A folder that
// cannot be looked at is skipped: check_output_path() names that problem.
inline std::string check_free_space(const std::vector<std::pair<std::string, uint64_t>>& files) {
  std::map<dev_t, uint64_t> needed;
  for (const auto& [path, bytes] : files) {
    const std::string folder = folder_of(path);
    struct stat st;
    struct statvfs fs;
    if (stat(folder.c_str(), &st) != 0 || statvfs(folder.c_str(), &fs) != 0) continue;
    const uint64_t need = needed[st.st_dev] += bytes;
    const uint64_t free = static_cast<uint64_t>(fs.f_bavail) * fs.f_frsize;
    if (need > free)
      return "not enough space for " + path + ": the run will write at least " + bytes_text(need) + " to " + folder +
             ", which has " + bytes_text(free) + " free";
  }
  return "";
}

// Makes a written file durable before it is moved into place (HDF5 does not fsync): otherwise a crash soon after
// the rename could leave an empty file under the real name, and an I/O error the kernel defers to writeback would
// go unseen. Throws the operating system's reason.
inline void sync_to_disk(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY);
  const bool ok = fd >= 0 && fsync(fd) == 0;
  const int error = errno;
  if (fd >= 0) close(fd);
  if (!ok) throw std::runtime_error(std::strerror(error));
}

// Makes the names in `folder` durable: a rename or link is an update of the folder, which fsync of the file does not
// cover. Best effort: some file systems refuse fsync on a folder (EINVAL), and the file's own data is synced already.
inline void sync_folder(const std::string& folder) {
  const int fd = open(folder.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) return;
  fsync(fd);
  close(fd);
}

// Moves a complete temporary into place. Without `force`, link() refuses to replace a file that appeared meanwhile;
// where the file system has no hard links (FAT, some FUSE and network mounts), rename() does it once the name is seen
// to be free. With `force`, rename() replaces atomically. On failure the complete temporary is kept and the error
// names it: a finished run is never thrown away for want of a name.
inline void publish_file(const std::string& tmp, const std::string& path, bool force) {
  const auto renamed = [&] { return std::rename(tmp.c_str(), path.c_str()) == 0; };
  bool ok = force ? renamed() : link(tmp.c_str(), path.c_str()) == 0;
  int error = errno;
  if (!ok && !force && (error == EPERM || error == EOPNOTSUPP || error == ENOSYS || error == EMLINK)) {
    struct stat st;
    if (stat(path.c_str(), &st) == 0) {
      error = EEXIST;
    } else if (errno != ENOENT) {
      error = errno;  // the name cannot be looked at: its reason, not a guess
    } else {
      ok = renamed();
      error = ok ? 0 : errno;
    }
  }
  if (!ok)
    throw WriteFailed("cannot create " + path + ": " + std::strerror(error) + "; the complete file is kept as " + tmp);
  unlink(tmp.c_str());  // after link(): the temporary name; after rename(): nothing (ENOENT)
  sync_folder(folder_of(path));
}

// A text file written whole or not at all, by the steps above: a reader never sees half of it, and a full disk
// throws here, naming the path, with whatever stood under the name left as it was.
inline void write_text_file(const std::string& path, const std::string& text, bool force) {
  const std::string tmp = temp_path_for(path);
  std::FILE* f = std::fopen(tmp.c_str(), "w");
  bool ok = f != nullptr && std::fwrite(text.data(), 1, text.size(), f) == text.size();
  if (f != nullptr) ok = std::fclose(f) == 0 && ok;
  if (!ok) {
    const int error = errno;
    unlink(tmp.c_str());
    throw WriteFailed("cannot write " + path + ": " + std::strerror(error));
  }
  try {
    sync_to_disk(tmp);
  } catch (const std::exception& e) {
    unlink(tmp.c_str());
    throw WriteFailed("cannot write " + path + ": " + e.what());
  }
  publish_file(tmp, path, force);
}

}  // namespace ddplab
