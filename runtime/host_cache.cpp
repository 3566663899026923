#include "runtime/host_cache.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

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
  // A bounded wait: the holder may be a stopped process (a first run's probe, Ctrl-Z'd), and every ddplab command
  // reads the cache before it starts; past the bound it goes on without the cache and says why.
  constexpr auto kLockWait = std::chrono::seconds(30);
  const auto give_up = std::chrono::steady_clock::now() + kLockWait;
  while (flock(lock.fd, LOCK_EX | LOCK_NB) != 0) {
    if (errno != EWOULDBLOCK && errno != EINTR) {
      error = "cannot lock " + path + ".lock: " + std::strerror(errno);
      return false;
    }
    if (std::chrono::steady_clock::now() > give_up) {
      error = "cannot lock " + path + ".lock: another process has held it for " + std::to_string(kLockWait.count()) +
              " s (a ddplab that is stopped?)";
      return false;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (const std::optional<nlohmann::json> next = change(read(path)); next && !write_atomically(path, *next)) {
    error = "cannot write " + path;
    return false;
  }
  return true;
}

}  // namespace ddplab::host_cache
