// The three forms of a node-local socket address (transport/shm/local_address.h) and what
// happens when a name is taken. Issue #14, item 11: an '@name' can be squatted by another
// user, so a bare name lives in this user's private 0700 directory.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <string>

#include "support/status_matchers.h"
#include "support/test_support.h"
#include "transport/shm/local_address.h"
#include "transport/shm/seqpacket_channel.h"

namespace ferry::shm {
namespace {

using std::chrono::milliseconds;

// Points XDG_RUNTIME_DIR at a fresh folder for the test's duration.
class PrivateRuntimeDir {
 public:
  PrivateRuntimeDir() {
    const char* old = std::getenv("XDG_RUNTIME_DIR");
    had_ = old != nullptr;
    if (had_) old_ = old;
    ::setenv("XDG_RUNTIME_DIR", dir_.path().c_str(), 1);
  }
  ~PrivateRuntimeDir() {
    if (had_) {
      ::setenv("XDG_RUNTIME_DIR", old_.c_str(), 1);
    } else {
      ::unsetenv("XDG_RUNTIME_DIR");
    }
  }
  std::string ferry_dir() const { return dir_.path() + "/ferry"; }

 private:
  ferry::testing::TempDir dir_;
  bool had_ = false;
  std::string old_;
};

std::string unique_name(const char* what) {
  return std::string("ferry-addr-test-") + what + "-" + std::to_string(::getpid());
}

TEST(ShmAddress, BareNameIsASocketInAPrivateDirectory) {
  PrivateRuntimeDir runtime;
  auto l = Listener::bind("job");
  ASSERT_OK(l);
  struct stat st {};
  ASSERT_EQ(::lstat(runtime.ferry_dir().c_str(), &st), 0);
  EXPECT_TRUE(S_ISDIR(st.st_mode));
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  EXPECT_EQ(st.st_uid, ::geteuid());
  const std::string sock = runtime.ferry_dir() + "/job";
  ASSERT_EQ(::lstat(sock.c_str(), &st), 0);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  auto c = connect("job", milliseconds(2000));
  EXPECT_OK(c);
  auto a = l->accept(milliseconds(2000));
  EXPECT_OK(a);
}

TEST(ShmAddress, TakenNameSaysWhichProcessHoldsIt) {
  PrivateRuntimeDir runtime;
  for (const std::string& name : {"@" + unique_name("abstract"), std::string("job")}) {
    auto first = Listener::bind(name);
    ASSERT_OK(first);
    auto second = Listener::bind(name);
    ASSERT_FALSE(second.ok()) << name;
    EXPECT_EQ(second.status().code(), Code::kAlreadyExists) << second.status().to_string();
    EXPECT_NE(second.status().message().find("pid " + std::to_string(::getpid())),
              std::string::npos)
        << second.status().message();
    // The first listener still works: the second bind did not take its socket.
    auto c = connect(name, milliseconds(2000));
    EXPECT_OK(c);
  }
}

TEST(ShmAddress, StaleSocketFileIsReplaced) {
  ferry::testing::TempDir dir;
  const std::string path = dir.file("stale.sock");
  {
    // A socket file whose listener is gone, as a killed sender leaves it.
    auto l = Listener::bind(path);
    ASSERT_OK(l);
    ASSERT_EQ(::link(path.c_str(), dir.file("keep").c_str()), 0);
  }
  ASSERT_EQ(::rename(dir.file("keep").c_str(), path.c_str()), 0);
  auto l = Listener::bind(path);
  EXPECT_OK(l);
}

TEST(ShmAddress, PathThatIsNotASocketIsLeftAlone) {
  ferry::testing::TempDir dir;
  const std::string path = dir.file("data.bin");
  ferry::testing::write_bytes(path, "precious");
  auto l = Listener::bind(path);
  ASSERT_FALSE(l.ok());
  EXPECT_EQ(l.status().code(), Code::kAlreadyExists) << l.status().to_string();
  struct stat st {};
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_TRUE(S_ISREG(st.st_mode));
}

TEST(ShmAddress, PrivateDirectoryOfAnotherUserOrASymlinkIsRefused) {
  {
    PrivateRuntimeDir runtime;
    ferry::testing::TempDir elsewhere;
    ASSERT_EQ(::symlink(elsewhere.path().c_str(), runtime.ferry_dir().c_str()), 0);
    auto l = Listener::bind("job");
    ASSERT_FALSE(l.ok());
    EXPECT_EQ(l.status().code(), Code::kFailedPrecondition);
    EXPECT_NE(l.status().message().find("symlink"), std::string::npos) << l.status().message();
  }
  {
    PrivateRuntimeDir runtime;
    ASSERT_EQ(::mkdir(runtime.ferry_dir().c_str(), 0755), 0);
    auto l = Listener::bind("job");
    ASSERT_FALSE(l.ok());
    EXPECT_NE(l.status().message().find("0700"), std::string::npos) << l.status().message();
  }
  if (::geteuid() != 0) GTEST_SKIP() << "needs root, to give the directory to uid 65534";
  PrivateRuntimeDir runtime;
  ASSERT_EQ(::mkdir(runtime.ferry_dir().c_str(), 0700), 0);
  ASSERT_EQ(::chown(runtime.ferry_dir().c_str(), 65534, 65534), 0);
  auto l = Listener::bind("job");
  ASSERT_FALSE(l.ok());
  EXPECT_EQ(l.status().code(), Code::kFailedPrecondition);
  EXPECT_NE(l.status().message().find("uid 65534"), std::string::npos) << l.status().message();
}

TEST(ShmAddress, EmptyAndOverlongAddressesAreRejected) {
  for (const std::string& bad : {std::string(""), std::string("@"), "/" + std::string(200, 'x')}) {
    auto l = Listener::bind(bad);
    ASSERT_FALSE(l.ok()) << bad;
    EXPECT_EQ(l.status().code(), Code::kInvalidArgument) << l.status().to_string();
  }
}

}  // namespace
}  // namespace ferry::shm
