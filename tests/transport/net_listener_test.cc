// Hostile peers against net::Listener (issue 14): nothing an unauthenticated client does
// may crash, stall or exhaust the listening process, and a legitimate peer still gets in.
#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

#include "base/clock.h"
#include "support/status_matchers.h"
#include "support/test_support.h"
#include "transport/net/address.h"
#include "transport/net/channel.h"

namespace ferry::net {
namespace {

using std::chrono::milliseconds;

constexpr milliseconds kTimeout{10000};

Token token() { return *Token::from_string(ferry::testing::kTestToken); }

// `from`: a loopback source address ("127.0.0.2"), as if from another host; "" any.
int raw_connect(const std::string& address, const std::string& from = "") {
  auto addr = resolve(address, false);
  const int fd = ::socket(addr->get()->sa_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (!from.empty()) {
    auto source = resolve(from + ":0", true);
    if (::bind(fd, source->get(), source->length) != 0) {
      ::close(fd);
      return -1;
    }
  }
  if (::connect(fd, addr->get(), addr->length) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

int open_fds() {
  int n = 0;
  DIR* d = ::opendir("/proc/self/fd");
  while (::readdir(d) != nullptr) ++n;
  ::closedir(d);
  return n;
}

long rss_kib() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stol(line.substr(6));
  }
  return -1;
}

// A legitimate peer on its own thread and Context: connects, sends "hello", waits for one
// message back.
class GoodPeer {
 public:
  explicit GoodPeer(std::string address)
      : thread_([this, address = std::move(address)] {
          auto ctx = Context::create();
          if (!ctx.ok()) {
            status_ = ctx.status();
            return;
          }
          auto ch = connect(*ctx, address, token(), kTimeout);
          if (!ch.ok()) {
            status_ = ch.status();
            return;
          }
          const std::vector<std::byte> hi = {std::byte{'h'}, std::byte{'i'}};
          status_ = ch->send(hi, kTimeout);
          if (status_.ok()) status_ = ch->receive(kTimeout).status();
          ch->close();
        }) {}
  ~GoodPeer() { join(); }
  const Status& status() {
    join();
    return status_;
  }
  void join() {
    if (thread_.joinable()) thread_.join();
  }

 private:
  Status status_;
  std::thread thread_;
};

// Accepts one peer, exchanges a message each way with it.
void serve_one(Listener& l, GoodPeer& peer) {
  auto ch = l.accept(kTimeout);
  ASSERT_OK(ch);
  auto m = ch->receive(kTimeout);
  ASSERT_OK(m);
  EXPECT_EQ(m->size(), 2u);
  ASSERT_OK(ch->send(std::vector<std::byte>(3), kTimeout));
  const auto deadline = Clock::now() + kTimeout;
  while (Clock::now() < deadline && ch->health().ok() &&
         ch->try_receive().ok()) {  // until the peer closes
    ch->context().wait(milliseconds(10));
  }
  EXPECT_OK(peer.status()) << peer.status().to_string();
}

Listener listen_here(const std::shared_ptr<Context>& ctx, ListenerOptions o = {}) {
  auto l = Listener::bind(ctx, "127.0.0.1:0", token(), o);
  EXPECT_OK(l);
  return std::move(*l);
}

TEST(NetListener, ClientThatConnectsAndVanishesWhileQueuedDoesNotCrashTheListener) {
  auto ctx = *Context::create();
  Listener l = listen_here(ctx);
  for (int i = 0; i < 20; ++i) {
    const int fd = raw_connect(l.address());
    ASSERT_GE(fd, 0);
    ::close(fd);  // gone before accept() ever looks at it
  }
  GoodPeer peer(l.address());
  serve_one(l, peer);
}

TEST(NetListener, RawGarbageIsRefusedAndALegitimatePeerConnectsAfter) {
  auto ctx = *Context::create();
  Listener l = listen_here(ctx);
  const int fd = raw_connect(l.address());
  ASSERT_GE(fd, 0);
  const std::vector<unsigned char> garbage(64, 0xff);
  ASSERT_EQ(::send(fd, garbage.data(), garbage.size(), MSG_NOSIGNAL), 64);
  GoodPeer peer(l.address());
  serve_one(l, peer);
  // The garbage connection was closed by the listener: our end reads EOF.
  char b;
  EXPECT_EQ(::recv(fd, &b, 1, 0), 0);
  ::close(fd);
}

TEST(NetListener, TwentySilentPeersDoNotKeepALegitimatePeerOut) {
  auto ctx = *Context::create();
  Listener l = listen_here(ctx);  // default 5 s handshake timeout: longer than the test needs
  // From three other loopback addresses (under the per-source cap of 8 each), as silent
  // peers on other hosts would be; a cap per source cannot tell peers of one host apart.
  std::vector<int> silent;
  for (int i = 0; i < 20; ++i) {
    silent.push_back(raw_connect(l.address(), "127.0.0." + std::to_string(2 + i % 3)));
    ASSERT_GE(silent.back(), 0);
  }
  (void)l.accept(milliseconds(100));  // the listener takes them all in
  EXPECT_EQ(l.handshakes(), 20u);
  const auto start = Clock::now();
  GoodPeer peer(l.address());
  serve_one(l, peer);
  // Bounded well under one handshake timeout: the silent peers did not hold the listener.
  EXPECT_LT(Clock::now() - start, milliseconds(4000));
  for (int fd : silent) ::close(fd);
}

TEST(NetListener, FdCountStaysFlatAfter200GarbageConnections) {
  auto ctx = *Context::create();
  Listener l = listen_here(ctx);
  (void)l.accept(milliseconds(0));
  const int before = open_fds();
  const std::vector<unsigned char> garbage(64, 0xff);
  for (int i = 0; i < 200; ++i) {
    const int fd = raw_connect(l.address());
    ASSERT_GE(fd, 0);
    (void)::send(fd, garbage.data(), garbage.size(), MSG_NOSIGNAL);
    ::close(fd);
    (void)l.accept(milliseconds(0));
  }
  const auto deadline = Clock::now() + kTimeout;
  while (l.handshakes() > 0 && Clock::now() < deadline) (void)l.accept(milliseconds(20));
  EXPECT_EQ(l.handshakes(), 0u);
  EXPECT_LE(open_fds(), before + 1);
}

TEST(NetListener, StreamFloodBeforeAuthKeepsMemoryBounded) {
  auto ctx = *Context::create();
  Listener l = listen_here(ctx);
  std::atomic<bool> stop{false};
  const long before = rss_kib();
  std::thread flood([&] {
    // 8 connections (the per-source cap) each writing as fast as the listener reads.
    std::vector<unsigned char> junk(1 << 16, 0x11);
    for (int c = 0; c < 16 && !stop; ++c) {
      const int fd = raw_connect(l.address());
      if (fd < 0) continue;
      for (int i = 0; i < 512 && !stop; ++i) {
        if (::send(fd, junk.data(), junk.size(), MSG_NOSIGNAL | MSG_DONTWAIT) <= 0) break;
      }
      ::close(fd);
    }
  });
  const auto deadline = Clock::now() + milliseconds(1500);
  while (Clock::now() < deadline) (void)l.accept(milliseconds(20));
  stop = true;
  flood.join();
  EXPECT_LT(rss_kib() - before, 32 * 1024) << "kB of RSS grew during the flood";
  GoodPeer peer(l.address());
  serve_one(l, peer);
}

TEST(NetListener, PortCanBeBoundAgainRightAfterClose) {
  auto ctx = *Context::create();
  std::string address;
  {
    Listener l = listen_here(ctx);
    address = l.address();
    GoodPeer peer(address);
    serve_one(l, peer);  // a real connection, so the port has sockets in TIME-WAIT
  }
  auto again = Listener::bind(ctx, address, token());
  ASSERT_OK(again);
  GoodPeer peer(address);
  serve_one(*again, peer);
}

// Issue 31: silent peers from many sources filled the table and kept a legitimate peer out
// until their handshakes timed out. A full table now drops its oldest unproven handshake.
TEST(NetListener, AFullTableMakesRoomByDroppingTheOldestUnprovenHandshake) {
  auto ctx = *Context::create();
  ListenerOptions o;
  o.max_handshakes = 3;
  o.handshake_timeout = milliseconds(60'000);  // longer than the test: only eviction frees
  std::vector<std::string> refusals;
  o.on_refused = [&refusals](const Status& s) { refusals.push_back(s.message()); };
  Listener l = listen_here(ctx, o);
  std::vector<int> fds;
  for (int i = 0; i < 3; ++i) fds.push_back(raw_connect(l.address()));
  (void)l.accept(milliseconds(100));
  EXPECT_EQ(l.handshakes(), 3u);
  GoodPeer peer(l.address());
  serve_one(l, peer);
  ASSERT_FALSE(refusals.empty());
  EXPECT_NE(refusals[0].find("the oldest unproven one"), std::string::npos) << refusals[0];
  for (int fd : fds) ::close(fd);
}

TEST(NetListener, PeersOverThePerSourceCapAreClosedAndTheCapFrees) {
  auto ctx = *Context::create();
  ListenerOptions o;
  o.max_handshakes_per_source = 2;
  o.handshake_timeout = milliseconds(300);
  Listener l = listen_here(ctx, o);
  std::vector<int> fds;
  for (int i = 0; i < 4; ++i) fds.push_back(raw_connect(l.address()));
  (void)l.accept(milliseconds(100));
  EXPECT_EQ(l.handshakes(), 2u);
  // Once the silent ones time out, a real peer from the same address gets in.
  GoodPeer peer(l.address());
  serve_one(l, peer);
  for (int fd : fds) ::close(fd);
}

}  // namespace
}  // namespace ferry::net

namespace ferry::net {
namespace {

// Reads all of `path`.
std::string slurp(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Issue 15 item 9: UCX printed its own warnings and errors to stdout, even under --json.
TEST(NetContext, UcxLogLinesGoToStderrNotStdout) {
  ferry::testing::TempDir dir;
  const std::string out_path = dir.file("stdout");
  const std::string err_path = dir.file("stderr");
  const int out = ::open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  const int err = ::open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  ASSERT_GE(out, 0);
  ASSERT_GE(err, 0);
  std::fflush(stdout);
  std::fflush(stderr);
  const int saved_out = ::dup(1);
  const int saved_err = ::dup(2);
  ::dup2(out, 1);
  ::dup2(err, 2);
  {
    ContextOptions o;
    o.path = NetPath::kUcx;
    o.transports = "ferry_no_such_transport,tcp";  // UCX warns that it is not available
    auto ctx = Context::create(o);
    std::fflush(stdout);
    std::fflush(stderr);
  }
  ::dup2(saved_out, 1);
  ::dup2(saved_err, 2);
  ::close(saved_out);
  ::close(saved_err);
  ::close(out);
  ::close(err);
  const std::string o = slurp(out_path);
  const std::string e = slurp(err_path);
  if (::getenv("UCX_TLS") != nullptr) GTEST_SKIP() << "UCX_TLS set: the option is not used";
  EXPECT_EQ(o.find("UCX"), std::string::npos) << "stdout: " << o;
  EXPECT_NE(e.find("UCX"), std::string::npos) << "stderr: " << e;
  EXPECT_NE(e.find("ferry_no_such_transport"), std::string::npos) << "stderr: " << e;
}

}  // namespace
}  // namespace ferry::net
