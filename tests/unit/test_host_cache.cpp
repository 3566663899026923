// The host's cache of measured choices (runtime/host_cache.h): where it lives, what a damaged file reads as, and that
// a change sees the file as the process before left it. Processes racing through it: test_blas_kernels.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "runtime/host_cache.h"
#include "tests/unit/scoped_variable.h"
#include "tests/unit/temp_dir.h"

namespace ddplab::host_cache {
namespace {

TEST(HostCache, DirectoryFollowsXdg) {
  {
    const ScopedVariable xdg("XDG_CACHE_HOME", "/somewhere/cache");
    EXPECT_EQ(directory(), "/somewhere/cache/ddplab");
  }
  {
    const ScopedVariable xdg("XDG_CACHE_HOME", "relative/cache");  // invalid under the XDG spec: HOME's default
    const ScopedVariable home("HOME", "/home/someone");
    EXPECT_EQ(directory(), "/home/someone/.cache/ddplab");
  }
  EXPECT_EQ(file_name("NVIDIA H200 (132 SMs)/x_1.2"), "NVIDIA-H200--132-SMs--x_1.2");
}

class HostCacheFile : public ddplab::TempDirTest {
 protected:
  std::string path() const { return dir_ + "/made/here/" + file_; }
  const std::string file_ = "answers.json";
};

TEST_F(HostCacheFile, ChangesSeeTheLastWrite) {
  EXPECT_TRUE(read(path()).is_null());
  std::string error;
  int calls = 0;
  const auto add_one = [&](const nlohmann::json& current) -> std::optional<nlohmann::json> {
    ++calls;
    nlohmann::json next = current.is_object() ? current : nlohmann::json::object();
    next["n"] = next.value("n", 0) + 1;
    return next;
  };
  ASSERT_TRUE(update(dir_ + "/made/here", file_, add_one, error)) << error;
  ASSERT_TRUE(update(dir_ + "/made/here", file_, add_one, error)) << error;
  EXPECT_EQ(calls, 2);
  EXPECT_EQ(read(path()), (nlohmann::json{{"n", 2}}));
  // nullopt leaves the file as it was.
  ASSERT_TRUE(update(
      dir_ + "/made/here", file_, [](const nlohmann::json&) { return std::nullopt; }, error));
  EXPECT_EQ(read(path()), (nlohmann::json{{"n", 2}}));
  EXPECT_FALSE(std::filesystem::exists(path() + ".tmp" + std::to_string(getpid())));
}

TEST_F(HostCacheFile, ADamagedFileReadsAsNothing) {
  std::filesystem::create_directories(dir_ + "/made/here");
  std::ofstream(path()) << "{\"n\": 1";  // cut short
  EXPECT_TRUE(read(path()).is_null());
  std::string error;
  nlohmann::json seen = "unset";
  ASSERT_TRUE(update(
      dir_ + "/made/here", file_,
      [&](const nlohmann::json& current) -> std::optional<nlohmann::json> {
        seen = current;
        return nlohmann::json{{"n", 1}};
      },
      error));
  EXPECT_TRUE(seen.is_null());
  EXPECT_EQ(read(path()), (nlohmann::json{{"n", 1}}));
}

TEST_F(HostCacheFile, NowhereToWriteIsAnError) {
  std::string error;
  const auto anything = [](const nlohmann::json&) { return std::optional<nlohmann::json>(nlohmann::json::object()); };
  std::ofstream(dir_ + "/a-file") << "";
  EXPECT_FALSE(update(dir_ + "/a-file/under", file_, anything, error));
  EXPECT_NE(error.find("cannot make"), std::string::npos) << error;
  EXPECT_FALSE(update("", file_, anything, error));
  EXPECT_NE(error.find("no cache directory"), std::string::npos) << error;
}

}  // namespace
}  // namespace ddplab::host_cache
