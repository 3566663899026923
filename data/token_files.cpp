#include "data/token_files.h"

#include <fcntl.h>
#include <fnmatch.h>
#include <glob.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <stdexcept>

namespace ddplab {

std::vector<std::string> token_shard_paths(const std::string& pattern) {
  glob_t found{};
  // GLOB_ERR: a folder that cannot be read is an error, not a silent gap in the shards.
  const int status = glob(pattern.c_str(), GLOB_NOSORT | GLOB_ERR, nullptr, &found);  // sorted below, by name
  std::vector<std::string> paths(found.gl_pathv, found.gl_pathv + (status == 0 ? found.gl_pathc : 0));
  globfree(&found);
  if (status == GLOB_ABORTED || status == GLOB_NOSPACE)
    throw std::invalid_argument(pattern + ": cannot list the files it matches (" +
                                (status == GLOB_ABORTED ? std::string("a folder cannot be read") : "out of memory") +
                                ")");
  if (paths.empty() && access(pattern.c_str(), F_OK) == 0) paths.push_back(pattern);  // a name with [ * ? in it
  std::sort(paths.begin(), paths.end());
  return paths;
}

bool token_pattern_matches(const std::string& pattern, const std::string& path) {
  if (pattern.empty() || path.empty()) return false;
  const auto absolute = [](const std::string& p) {
    std::error_code error;
    const std::filesystem::path a = std::filesystem::absolute(p, error);
    return (error ? std::filesystem::path(p) : a).lexically_normal().string();
  };
  return fnmatch(absolute(pattern).c_str(), absolute(path).c_str(), FNM_PATHNAME | FNM_PERIOD) == 0;
}

namespace {

// Windows of `window` tokens in `count`, each starting on the previous one's last token.
int64_t windows_in(int64_t count, int window) { return count < window ? 0 : (count - 1) / (window - 1); }

}  // namespace

TokenFiles::TokenFiles(const std::string& pattern, int window) : pattern_(pattern), window_(window) {
  if (window < 2) throw std::invalid_argument("token shards: a window needs at least 2 tokens (a token and its next)");
  const std::vector<std::string> paths = token_shard_paths(pattern);
  if (paths.empty()) throw std::invalid_argument(pattern + ": no such file");
  try {
    for (const std::string& path : paths) {
      Shard shard;
      shard.path = path;
      // O_NONBLOCK: a pipe opens at once, to be refused below, rather than wait for a writer.
      const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
      if (fd < 0) throw std::invalid_argument(path + ": " + std::strerror(errno));
      struct stat st {};
      if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        throw std::invalid_argument(path + ": not a regular file");
      }
      const int64_t bytes = st.st_size;
      if (bytes < kTokenShardHeaderBytes) {
        close(fd);
        throw std::invalid_argument(path + ": not a token shard (" + std::to_string(bytes) +
                                    " bytes, shorter than llm.c's 1024-byte header)");
      }
      shard.mapping = mmap(nullptr, static_cast<size_t>(bytes), PROT_READ, MAP_SHARED, fd, 0);
      close(fd);  // the mapping keeps the file
      if (shard.mapping == MAP_FAILED) throw std::invalid_argument(path + ": mmap: " + std::strerror(errno));
      shard.mapped_bytes = static_cast<size_t>(bytes);
      shards_.push_back(shard);  // unmapped by the destructor, or below if a later check throws

      int32_t header[3];
      std::memcpy(header, shard.mapping, sizeof header);
      if (header[0] != kTokenShardMagic)
        throw std::invalid_argument(path + ": not a token shard (magic " + std::to_string(header[0]) + ", llm.c's is " +
                                    std::to_string(kTokenShardMagic) + ")");
      if (header[1] != kTokenShardVersion)
        throw std::invalid_argument(path + ": token shard version " + std::to_string(header[1]) +
                                    ", only version 1 (uint16 tokens, GPT-2's) is read");
      const int64_t count = header[2];
      if (count < 0 || kTokenShardHeaderBytes + 2 * count != bytes)
        throw std::invalid_argument(path + ": the header counts " + std::to_string(count) + " tokens, the file holds " +
                                    std::to_string((bytes - kTokenShardHeaderBytes) / 2) + " (" +
                                    std::to_string(bytes) + " bytes): truncated or not a token shard");
      Shard& kept = shards_.back();
      kept.tokens = reinterpret_cast<const uint16_t*>(static_cast<const char*>(shard.mapping) + kTokenShardHeaderBytes);
      kept.count = count;
      kept.first_window = windows_;
      windows_ += windows_in(count, window);
    }
    if (windows_ == 0)
      throw std::invalid_argument(pattern + ": no shard holds a window of --max-len " + std::to_string(window) +
                                  " tokens (" + std::to_string(tokens()) + " tokens in all); lower --max-len");
  } catch (...) {
    for (const Shard& s : shards_) munmap(s.mapping, s.mapped_bytes);
    throw;
  }
}

TokenFiles::~TokenFiles() {
  for (const Shard& s : shards_) munmap(s.mapping, s.mapped_bytes);
}

void TokenFiles::fill(int32_t* tokens, int64_t i) const {
  if (i < 0 || i >= windows_)
    throw std::out_of_range("token shards: window " + std::to_string(i) + " of " + std::to_string(windows_));
  // The last shard whose first window is at or before i.
  const auto shard = std::upper_bound(shards_.begin(), shards_.end(), i,
                                      [](int64_t index, const Shard& s) { return index < s.first_window; }) -
                     1;
  const uint16_t* from = shard->tokens + (i - shard->first_window) * (window_ - 1);
  std::copy(from, from + window_, tokens);
}

int64_t TokenFiles::tokens() const {
  int64_t n = 0;
  for (const Shard& s : shards_) n += s.count;
  return n;
}

std::string TokenFiles::first_token_outside(int vocab, int part, int parts,
                                            const std::function<void()>& progress) const {
  constexpr int64_t kTokensBetweenProgress = int64_t{1} << 26;
  for (size_t k = part; k < shards_.size(); k += parts) {
    const Shard& s = shards_[k];
    for (int64_t first = 0; first < s.count; first += kTokensBetweenProgress) {
      const uint16_t *begin = s.tokens + first, *end = s.tokens + std::min(s.count, first + kTokensBetweenProgress);
      const uint16_t* at = std::find_if(begin, end, [vocab](uint16_t t) { return t >= vocab; });
      if (at != end) return s.path + ": token " + std::to_string(*at) + " at index " + std::to_string(at - s.tokens);
      if (progress) progress();
    }
  }
  return "";
}

std::string TokenFiles::fingerprint() const {
  uint64_t hash = 0xcbf29ce484222325ull;  // FNV-1a, 64 bits: the same on every host and build
  const auto add = [&hash](const void* bytes, size_t n) {
    for (size_t i = 0; i < n; ++i) hash = (hash ^ static_cast<const unsigned char*>(bytes)[i]) * 0x100000001b3ull;
  };
  for (const Shard& s : shards_) {
    const std::string name = s.path.substr(s.path.find_last_of('/') + 1);  // npos + 1 = 0: no folder
    add(name.data(), name.size() + 1);
    add(&s.count, sizeof s.count);
  }
  char text[96];
  std::snprintf(text, sizeof text, "%lld windows of %d in %d shard%s, %016llx", static_cast<long long>(windows_),
                window_, shards(), shards() == 1 ? "" : "s", static_cast<unsigned long long>(hash));
  return text;
}

std::string TokenFiles::describe() const {
  char text[160];
  std::snprintf(text, sizeof text, " (%.4gM tokens in %d shard%s, %lld windows of %d)", tokens() / 1e6, shards(),
                shards() == 1 ? "" : "s", static_cast<long long>(windows_), window_);
  return "data " + pattern_ + text;
}

}  // namespace ddplab
