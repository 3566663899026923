// A test fixture with a fresh folder of its own under /tmp, removed with everything in it after each test.
#pragma once
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <string>

namespace ddplab {

class TempDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/ddplab_test_XXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr) << "cannot make a folder under /tmp";
    dir_ = pattern;
  }
  void TearDown() override {
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }
  std::string path(const std::string& name) const { return dir_ + "/" + name; }
  std::string dir_;
};

}  // namespace ddplab
