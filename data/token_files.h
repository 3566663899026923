// Token shards in llm.c's format, read as fixed-length windows for the transformer's LM head.
//
// A shard is a header of 256 little-endian int32 (magic 20240520, version 1, the token count), then that many
// uint16 token ids: what llm.c's dev/data scripts write (tinyshakespeare, fineweb, ...), and scripts/text_to_tokens.py
// from any text. A pattern names one shard or a glob of them, read in name order.
//
// Sequence i of the epoch is window i: `window` consecutive tokens of one shard, each window starting on the last
// token of the one before. The LM head predicts every token of a sequence from the ones before it, so every pair
// (token, next token) of a shard is a loss term of exactly one window per epoch, as in llm.c's batches (whose rows of
// T inputs read T + 1 tokens). No window spans two shards.
//
// The shards are memory-mapped read-only: opening a set of many gigabytes reads only their headers, and the ranks on
// one host share the pages. (The command line reads every token once before a run, the ranks sharing the shards.)
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "data/tokens.h"

namespace ddplab {

inline constexpr int32_t kTokenShardMagic = 20240520;
inline constexpr int32_t kTokenShardVersion = 1;  // uint16 tokens
inline constexpr int64_t kTokenShardHeaderBytes = 256 * 4;

// The files a --data or --val-data pattern names (a file, or a glob), sorted by name; none: empty. Throws
// std::invalid_argument when a folder it must list cannot be read.
std::vector<std::string> token_shard_paths(const std::string& pattern);
// Whether a file at `path`, once written, would be one that `pattern` names (both taken from the working folder):
// what a run writes must not become a shard of the next run's --data.
bool token_pattern_matches(const std::string& pattern, const std::string& path);

class TokenFiles : public TokenSource {
 public:
  // Throws std::invalid_argument naming the shard and what is wrong with it: no file matches, a header that is not
  // llm.c's, a size that disagrees with the header's count, or no window in any shard.
  TokenFiles(const std::string& pattern, int window);
  ~TokenFiles() override;
  TokenFiles(const TokenFiles&) = delete;
  TokenFiles& operator=(const TokenFiles&) = delete;

  int64_t sequences() const override { return windows_; }
  int min_len() const override { return window_; }
  int max_len() const override { return window_; }
  int length(int64_t) const override { return window_; }
  int32_t label(int64_t) const override { return 0; }  // none: the LM head reads no label
  void fill(int32_t* tokens, int64_t i) const override;

  int64_t tokens() const;  // in all shards
  int shards() const { return static_cast<int>(shards_.size()); }
  // "" if every token id of shards part, part + parts, ... is below `vocab`, else where the first one is not:
  // "<shard>: token 50310 at index 17". Reads those shards' every token (N processes with parts N share the reading),
  // calling progress (if given) after each 64M of them: a scan of many GB takes a while.
  std::string first_token_outside(int vocab, int part = 0, int parts = 1,
                                  const std::function<void()>& progress = {}) const;
  // "data <pattern> (1.2M tokens in 2 shards, 1172 windows of 1024)".
  std::string describe() const override;
  // What a resumed run must read again, wherever the shards now lie: "1172 windows of 1024 in 2 shards, 9f0c..."
  // (the windows, and a hash of the shards' file names and token counts, in order). Shards rewritten with the same
  // names and counts are not told apart: that would need every token read again.
  std::string fingerprint() const;

 private:
  struct Shard {
    std::string path;
    const uint16_t* tokens = nullptr;  // into the mapping, past the header
    int64_t count = 0;
    int64_t first_window = 0;  // the epoch's index of the shard's first window
    void* mapping = nullptr;
    size_t mapped_bytes = 0;
  };
  std::string pattern_;
  int window_;
  std::vector<Shard> shards_;
  int64_t windows_ = 0;
};

}  // namespace ddplab
