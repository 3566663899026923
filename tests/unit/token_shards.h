// Token shards for tests, written as llm.c writes them (data/token_files.h): 256 int32 of header, then uint16s.
#pragma once
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "data/token_files.h"

namespace ddplab {

// A shard holding `tokens`; `count` overrides the header's token count (a damaged shard), `magic` and `version` too.
inline void write_token_shard(const std::string& path, const std::vector<uint16_t>& tokens, int64_t count = -1,
                              int32_t magic = kTokenShardMagic, int32_t version = kTokenShardVersion) {
  std::vector<int32_t> header(256, 0);
  header[0] = magic;
  header[1] = version;
  header[2] = static_cast<int32_t>(count < 0 ? static_cast<int64_t>(tokens.size()) : count);
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) throw std::runtime_error("cannot write " + path);
  std::fwrite(header.data(), sizeof(int32_t), header.size(), f);
  std::fwrite(tokens.data(), sizeof(uint16_t), tokens.size(), f);
  std::fclose(f);
}

// 0, 1, 2, ...: token k of a shard is its own index plus `first`, modulo `vocab`, so a window's tokens name it.
inline std::vector<uint16_t> counting_tokens(int64_t n, int first = 0, int vocab = 60000) {
  std::vector<uint16_t> tokens(n);
  for (int64_t k = 0; k < n; ++k) tokens[k] = static_cast<uint16_t>((first + k) % vocab);
  return tokens;
}

}  // namespace ddplab
