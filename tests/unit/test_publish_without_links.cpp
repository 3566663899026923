// Publishing a complete file on a file system without hard links (FAT, some FUSE and network mounts), where link()
// fails with EPERM (record/files.h, publish_file): the name is taken by rename() once it is seen to be free, and a
// name taken meanwhile is refused with the complete file kept, as where links work. This binary's own link() stands
// in for such a file system: it refuses every link while `links_refused` is set.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "record/files.h"

namespace {
bool links_refused = false;
}  // namespace

// Interposes the C library's: the executable's definition is the one every call in this process reaches.
extern "C" int link(const char* from, const char* to) {
  if (links_refused) {
    errno = EPERM;
    return -1;
  }
  return static_cast<int>(syscall(SYS_linkat, AT_FDCWD, from, AT_FDCWD, to, 0));
}

namespace ddplab {
namespace {

namespace fs = std::filesystem;

class PublishWithoutLinks : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/ddplab_publish_XXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    dir_ = pattern;
    links_refused = true;
  }
  void TearDown() override {
    links_refused = false;
    fs::remove_all(dir_);
  }
  static void write(const std::string& path, const std::string& text) { std::ofstream(path) << text; }
  static std::string read(const std::string& path) {
    std::stringstream s;
    s << std::ifstream(path).rdbuf();
    return s.str();
  }
  std::string dir_;
};

TEST_F(PublishWithoutLinks, TheLinkItselfIsRefused) {
  write(dir_ + "/a", "a");
  EXPECT_EQ(link((dir_ + "/a").c_str(), (dir_ + "/b").c_str()), -1);
  EXPECT_EQ(errno, EPERM);
}

TEST_F(PublishWithoutLinks, AFreeNameIsTakenByRename) {
  const std::string path = dir_ + "/run.h5", tmp = temp_path_for(path);
  write(tmp, "done");
  publish_file(tmp, path, /*force=*/false);
  EXPECT_EQ(read(path), "done");
  EXPECT_FALSE(fs::exists(tmp));
  // write_text_file goes the same way.
  write_text_file(dir_ + "/page.html", "page", /*force=*/false);
  EXPECT_EQ(read(dir_ + "/page.html"), "page");
  EXPECT_EQ(std::distance(fs::directory_iterator(dir_), fs::directory_iterator{}), 2) << "no temporary left";
}

TEST_F(PublishWithoutLinks, ATakenNameIsRefusedAndTheCompleteFileKept) {
  const std::string path = dir_ + "/run.h5", tmp = temp_path_for(path);
  write(tmp, "done");
  write(path, "other");
  try {
    publish_file(tmp, path, /*force=*/false);
    ADD_FAILURE() << "published over " << path;
  } catch (const std::runtime_error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("cannot create " + path + ": " + std::strerror(EEXIST)), std::string::npos) << what;
    EXPECT_NE(what.find("the complete file is kept as " + tmp), std::string::npos) << what;
  }
  EXPECT_EQ(read(tmp), "done");
  EXPECT_EQ(read(path), "other");
  publish_file(tmp, path, /*force=*/true);  // --force renames over it, links or not
  EXPECT_EQ(read(path), "done");
  EXPECT_FALSE(fs::exists(tmp));
}

// A name that cannot be looked at is refused with its own reason, not taken for free.
TEST_F(PublishWithoutLinks, ANameThatCannotBeLookedAtIsRefusedWithItsReason) {
  const std::string tmp = dir_ + "/run.h5.tmp";
  write(tmp, "done");
  write(dir_ + "/file", "");
  const std::string path = dir_ + "/file/run.h5";  // a file where a folder should be: ENOTDIR
  try {
    publish_file(tmp, path, /*force=*/false);
    ADD_FAILURE() << "published to " << path;
  } catch (const std::runtime_error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(std::string(": ") + std::strerror(ENOTDIR) + ";"), std::string::npos) << what;
  }
  EXPECT_EQ(read(tmp), "done");
}

}  // namespace
}  // namespace ddplab
