#include "runtime/host_cache.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

namespace ddplab::host_cache {
namespace {

struct LockFile {
  explicit LockFile(const std::string& path) : fd(open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644)) {}
  ~LockFile() {
    if (fd >= 0) close(fd);
  }
  LockFile(const LockFile&) = delete;
  LockFile& operator=(const LockFile&) = delete;
  const int fd;
};

bool write_atomically(const std::string& path, const nlohmann::json& j) {
  const std::string temporary = path + ".tmp" + std::to_string(getpid());
  {
    std::ofstream out(temporary, std::ios::trunc);
    out << j.dump(1) << "\n";
    out.close();
    if (!out) {
      std::remove(temporary.c_str());
      return false;
    }
  }
  if (std::rename(temporary.c_str(), path.c_str()) == 0) return true;
  std::remove(temporary.c_str());
  return false;
}

}  // namespace

std::string directory() {
  // XDG Base Directory: a relative XDG_CACHE_HOME is invalid and ignored.
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg && xdg[0] == '/') return std::string(xdg) + "/ddplab";
  if (const char* home = std::getenv("HOME"); home && home[0]) return std::string(home) + "/.cache/ddplab";
  return "";
}

std::string file_name(std::string name) {
  for (char& c : name)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '-' && c != '_') c = '-';
  return name;
}

nlohmann::json read(const std::string& path) {
  std::ifstream in(path);
  if (!in) return nullptr;
  nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  return j.is_discarded() ? nlohmann::json(nullptr) : j;
}

bool update(const std::string& dir, const std::string& file, const Change& change, std::string& error) {
  if (dir.empty()) {
    error = "no cache directory, neither XDG_CACHE_HOME nor HOME is set";
    return false;
  }
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    error = "cannot make " + dir + ": " + ec.message();
    return false;
  }
  const std::string path = dir + "/" + file;
  const LockFile lock(path + ".lock");  // closed, and so released, however this returns (an exception of change too)
  if (lock.fd < 0) {
    error = "cannot open " + path + ".lock: " + std::strerror(errno);
    return false;
  }
  int locked;
  while ((locked = flock(lock.fd, LOCK_EX)) != 0 && errno == EINTR) {
  }
  if (locked != 0) {
    error = "cannot lock " + path + ".lock: " + std::strerror(errno);
    return false;
  }
  if (const std::optional<nlohmann::json> next = change(read(path)); next && !write_atomically(path, *next)) {
    error = "cannot write " + path;
    return false;
  }
  return true;
}

}  // namespace ddplab::host_cache
