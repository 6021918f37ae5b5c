// What every transport behind transport::Channel and transport::Listener promises, one test
// body per behaviour run over shm and net: whole messages up to the limit and not one byte
// more, a close the peer sees, a receive deadline kept, a killed peer named, a listener that
// refuses a second bind and frees its address on close, segments that arrive bit-exact and a
// missing one that times out, connect errors that name the listener as the caller says.
// Both ends go through a transport::Registry, which picks the transport from the address.
//
// The listening end runs on the test's thread; a peer runs on a thread of its own, or as a
// child process (this binary re-executed with FERRY_CONFORMANCE_CHILD set) when it is killed.
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "base/clock.h"
#include "base/coding.h"
#include "support/status_matchers.h"
#include "support/test_support.h"
#include "transport/registry.h"
#include "transport/transport.h"

namespace ferry::transport {
namespace {

using std::chrono::milliseconds;

constexpr milliseconds kTimeout{10000};

std::vector<std::byte> pattern(std::size_t n, unsigned seed) {
  std::vector<std::byte> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<std::byte>((i * 131 + seed) >> 3);
  return v;
}

double ms_since(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

enum class Kind { kShm, kNet };

// The session secret in a file of mode 0600, as a node holds it.
const std::string& secret_file() {
  static const testing::TempDir dir;
  static const std::string path = [] {
    const std::string p = dir.file("token");
    testing::write_bytes(p, testing::kTestToken);
    ::chmod(p.c_str(), 0600);
    return p;
  }();
  return path;
}

TransportConfig config() { return {.secret_file = secret_file()}; }

// A listener of its own transports (net: its own Context).
Result<std::unique_ptr<Listener>> listen_alone(const std::string& address) {
  Registry transports(config());
  return transports.listen(address);
}

// A peer is another process or node: its own transports.
Result<std::unique_ptr<Channel>> connect_alone(const std::string& address, milliseconds timeout,
                                               const TransportConfig& peer_config = config()) {
  Registry transports(peer_config);
  return transports.connect(address, timeout);
}

// A fresh address of `kind` nobody listens on yet (net: port 0, bound to a free one).
std::string fresh_address(Kind kind) {
  static std::atomic<int> n{0};
  if (kind == Kind::kNet) return "127.0.0.1:0";
  return "@ferry-conformance-" + std::to_string(::getpid()) + "-" + std::to_string(n++);
}

// The listening end: a transport::Listener from the factory, and its wait loop, which keeps
// its side progressing while the test waits for a peer.
class Server {
 public:
  explicit Server(Kind kind) {
    auto l = listen_alone(fresh_address(kind));
    EXPECT_OK(l);
    if (!l.ok()) return;
    listener_ = std::move(*l);
    poller_ = listener_->poller();
  }
  bool ok() const { return listener_ != nullptr; }
  Listener& listener() { return *listener_; }
  const std::string& address() const { return listener_->address(); }
  Result<std::unique_ptr<Channel>> accept(milliseconds timeout) {
    return listener_->accept(timeout);
  }
  // Lets the transport make progress for about `d` (net: UCX answers a peer's close).
  void idle(milliseconds d) {
    std::vector<pollfd> none;
    poller_->progress();
    (void)poller_->wait(none, d);
  }

 private:
  std::unique_ptr<Listener> listener_;
  std::unique_ptr<Poller> poller_;
};

// A peer on its own thread: connects through the factory, runs `body`, closes.
class PeerThread {
 public:
  PeerThread(std::string address, std::function<Status(Channel&)> body)
      : thread_([this, address = std::move(address), body = std::move(body)] {
          status_ = run(address, body);
          finished_ = true;
        }) {}
  ~PeerThread() {
    if (thread_.joinable()) thread_.join();
  }
  // Joins while the server side progresses, so a peer's closing flush is answered.
  Status finish(Server& server) {
    while (!finished_) server.idle(milliseconds(10));
    thread_.join();
    return status_;
  }

 private:
  static Status run(const std::string& address, const std::function<Status(Channel&)>& body) {
    auto ch = connect_alone(address, kTimeout);
    if (!ch.ok()) return ch.status();
    Status s = body(**ch);
    (*ch)->close();
    return s;
  }
  Status status_;
  std::atomic<bool> finished_{false};
  std::thread thread_;
};

class Conformance : public ::testing::TestWithParam<Kind> {
 protected:
  void SetUp() override {
    server_ = std::make_unique<Server>(GetParam());
    ASSERT_TRUE(server_->ok()) << "listen() failed";
  }
  std::unique_ptr<Channel> accept() {
    auto ch = server_->accept(kTimeout);
    EXPECT_OK(ch);
    return ch.ok() ? std::move(*ch) : nullptr;
  }
  std::unique_ptr<Server> server_;
};

TEST_P(Conformance, FactoryPicksTheTransportFromTheAddress) {
  EXPECT_EQ(Registry::scheme_of(server_->address()), GetParam() == Kind::kNet ? "net" : "shm")
      << server_->address();
  EXPECT_FALSE(server_->address().ends_with(":0")) << "port 0 is bound to a real port";
  PeerThread peer(server_->address(), [](Channel& ch) { return ch.send(pattern(1, 0), kTimeout); });
  auto ch = accept();
  ASSERT_NE(ch, nullptr);
  EXPECT_EQ(ch->shares_memory(), GetParam() == Kind::kShm);
  EXPECT_EQ(ch->passes_fds(), GetParam() == Kind::kShm);
  EXPECT_OK(ch->receive(kTimeout));
  EXPECT_OK(peer.finish(*server_));
}

// The peer answers each message with its size and hash (a limit-sized echo would cost a
// second 64 MiB crossing; net's control path is slow for messages that large).
TEST_P(Conformance, MessagesUpToTheLimitArriveWholeAndInOrder) {
  const std::vector<std::size_t> sizes = {0, 1, 4095, 65537, (1u << 20) + 7, kMaxMessageBytes};
  constexpr milliseconds kLargeTimeout{60000};  // 64 MiB over a loaded machine's loopback
  PeerThread peer(server_->address(), [&](Channel& ch) -> Status {
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      auto m = ch.receive(kLargeTimeout);
      if (!m.ok()) return m.status();
      std::vector<std::byte> answer;
      coding::put_u64(&answer, m->size());
      coding::put_u64(&answer, testing::hash_bytes(*m));
      Status s = ch.send(answer, kTimeout);
      if (!s.ok()) return s;
    }
    return ok_status();
  });
  auto ch = accept();
  ASSERT_NE(ch, nullptr);
  // Sent all first: order and boundaries must survive several messages in flight.
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    ASSERT_OK(ch->send(pattern(sizes[i], static_cast<unsigned>(i)), kLargeTimeout)) << i;
  }
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    auto m = ch->receive(kLargeTimeout);
    ASSERT_OK(m) << "message " << i;
    coding::Reader answer(*m);
    EXPECT_EQ(answer.u64(), sizes[i]) << "message " << i;
    EXPECT_EQ(answer.u64(), testing::hash_bytes(pattern(sizes[i], static_cast<unsigned>(i))))
        << "message " << i;
    EXPECT_TRUE(answer.ok() && answer.remaining() == 0) << "message " << i;
  }
  EXPECT_OK(peer.finish(*server_));
}

TEST_P(Conformance, MessageOneBytePastTheLimitIsRefusedNamingThePeer) {
  PeerThread peer(server_->address(), [](Channel& ch) { return ch.receive(kTimeout).status(); });
  auto ch = accept();
  ASSERT_NE(ch, nullptr);
  const Status s = ch->send(std::vector<std::byte>(kMaxMessageBytes + 1), kTimeout);
  EXPECT_EQ(s.code(), Code::kInvalidArgument) << s.to_string();
  EXPECT_NE(s.message().find(ch->peer()), std::string::npos) << s.message();
  // Refused before a byte left: the channel still works.
  ASSERT_OK(ch->send(pattern(3, 1), kTimeout));
  EXPECT_OK(peer.finish(*server_));
}

TEST_P(Conformance, CloseIsSeenByThePeerAfterItsLastMessages) {
  PeerThread peer(server_->address(),
                  [](Channel& ch) { return ch.send(pattern(10, 1), kTimeout); });
  auto ch = accept();
  ASSERT_NE(ch, nullptr);
  auto first = ch->receive(kTimeout);
  ASSERT_OK(first);  // delivered before the close
  EXPECT_EQ(first->size(), 10u);
  const auto start = Clock::now();
  auto m = ch->receive(kTimeout);
  EXPECT_EQ(m.status().code(), Code::kAborted) << m.status().to_string();
  EXPECT_NE(m.status().message().find(ch->peer() + " closed the connection"), std::string::npos)
      << m.status().message();
  EXPECT_LT(ms_since(start), 2000);
  EXPECT_OK(peer.finish(*server_));
  EXPECT_LT(ms_since(start), 900) << "the peer's close waited for a FIN it should have had";
}

// post() never waits on a peer that does not read: what it cannot hand on stays queued, whole
// (flush_posted() says how much), and arrives in order once the peer reads. More than the
// socket buffers of either transport hold, so some of it must queue.
TEST_P(Conformance, PostedMessagesNeverWaitAndArriveWholeInOrder) {
  constexpr std::size_t kMessages = 24, kBytes = (2u << 20) + 7;
  std::atomic<bool> read{false};
  PeerThread peer(server_->address(), [&](Channel& ch) -> Status {
    // Bounded: a failed ASSERT below returns before `read` is set, and ~PeerThread joins.
    const auto until = Clock::now() + kTimeout;
    while (!read && Clock::now() < until) std::this_thread::sleep_for(milliseconds(5));
    for (std::size_t i = 0; i < kMessages; ++i) {
      auto m = ch.receive(kTimeout);
      if (!m.ok()) return m.status();
      if (*m != pattern(kBytes, static_cast<unsigned>(i))) {
        return corruption("posted message " + std::to_string(i) + " arrived changed");
      }
    }
    return ok_status();
  });
  auto ch = accept();
  ASSERT_NE(ch, nullptr);
  std::size_t queued = 0;
  for (std::size_t i = 0; i < kMessages; ++i) {
    const auto start = Clock::now();
    auto q = ch->post(pattern(kBytes, static_cast<unsigned>(i)));
    ASSERT_OK(q) << i;
    EXPECT_LT(ms_since(start), 1000) << "post " << i << " waited on the peer";
    queued = *q;
  }
  EXPECT_GT(queued, 0u) << "the peer reads nothing yet: some must wait";
  read = true;
  const auto deadline = Clock::now() + kTimeout;
  while (queued > 0 && Clock::now() < deadline) {
    server_->idle(milliseconds(1));
    auto q = ch->flush_posted();
    ASSERT_OK(q);
    queued = *q;
  }
  EXPECT_EQ(queued, 0u);
  EXPECT_OK(peer.finish(*server_));
}

TEST_P(Conformance, ReceiveDeadlineIsKeptAndNamesThePeer) {
  PeerThread peer(server_->address(), [](Channel& ch) { return ch.receive(kTimeout).status(); });
  auto ch = accept();
  ASSERT_NE(ch, nullptr);
  const auto start = Clock::now();
  auto m = ch->receive(milliseconds(300));
  EXPECT_EQ(m.status().code(), Code::kTimeout) << m.status().to_string();
  EXPECT_NE(m.status().message().find(ch->peer()), std::string::npos) << m.status().message();
  EXPECT_GE(ms_since(start), 290);
  EXPECT_LT(ms_since(start), 1500);
  // A timeout is not a failure of the channel.
  ASSERT_OK(ch->send(pattern(1, 2), kTimeout));
  EXPECT_OK(peer.finish(*server_));
}

// The one receive loop every caller runs, whatever the transport: progress(), try_receive()
// on the channel, wait() over its poll_fd(). It answers nothing at once while the peer is
// silent, hears messages of one byte and of many shm chunks whole and in order, and then the
// peer's close.
TEST_P(Conformance, ReceiveLoopHearsEveryMessageThenTheClose) {
  const std::vector<std::size_t> sizes = {1, (3u << 20) + 5, 0, 70000};
  PeerThread peer(server_->address(), [&](Channel& ch) -> Status {
    auto go = ch.receive(kTimeout);
    if (!go.ok()) return go.status();
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      Status s = ch.send(pattern(sizes[i], static_cast<unsigned>(i)), kTimeout);
      if (!s.ok()) return s;
    }
    return ok_status();
  });
  auto ch = accept();
  ASSERT_NE(ch, nullptr);
  auto poller = ch->poller();
  poller->progress();
  const auto start = Clock::now();
  auto nothing = ch->try_receive(kTimeout);
  ASSERT_OK(nothing);
  EXPECT_FALSE(nothing->has_value()) << "a message before the peer sent one";
  EXPECT_LT(ms_since(start), 200) << "try_receive waited for a message";

  ASSERT_OK(ch->send(pattern(1, 9), kTimeout));
  std::vector<std::vector<std::byte>> heard;
  Status closed;
  const auto deadline = Clock::now() + kTimeout;
  while (closed.ok() && Clock::now() < deadline) {
    poller->progress();
    auto got = ch->try_receive(kTimeout);
    if (!got.ok()) {
      closed = got.status();
      break;
    }
    if (got->has_value()) {
      heard.push_back(std::move(**got));
      continue;
    }
    std::vector<pollfd> fds{{ch->poll_fd(), POLLIN, 0}};
    ASSERT_OK(poller->wait(fds, milliseconds(100)));
  }
  ASSERT_EQ(heard.size(), sizes.size());
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    EXPECT_EQ(heard[i], pattern(sizes[i], static_cast<unsigned>(i))) << "message " << i;
  }
  EXPECT_EQ(closed.code(), Code::kAborted) << closed.to_string();
  EXPECT_NE(closed.message().find(ch->peer()), std::string::npos) << closed.message();
  EXPECT_OK(peer.finish(*server_));
}

// ---- the listener ----

TEST_P(Conformance, ListenerRefusesASecondBindNamingTheAddressAndClosesForGood) {
  const std::string address = server_->address();
  PeerThread peer(address, [](Channel& ch) { return ch.send(pattern(2, 4), kTimeout); });
  auto ch = accept();
  ASSERT_NE(ch, nullptr);
  EXPECT_OK(ch->receive(kTimeout));
  EXPECT_OK(peer.finish(*server_));

  // After the accept: shm's refusal probes the holder with a connection of its own.
  auto second = listen_alone(address);
  ASSERT_FALSE(second.ok()) << "a second listener bound " << address;
  EXPECT_NE(second.status().message().find(address), std::string::npos)
      << second.status().message();

  server_->listener().close();
  EXPECT_EQ(server_->listener().fd(), -1);
  EXPECT_EQ(server_->listener().address(), address) << "a closed listener still names itself";
  auto late = connect_alone(address, milliseconds(300));
  EXPECT_FALSE(late.ok()) << "connected to a closed listener at " << address;
  // Its address is free again (the shm socket file is gone, the port released).
  EXPECT_OK(listen_alone(address));
}

// ---- segments ----

// The sending end's ring, allocated by the transport: one slot with a pattern in it,
// registered for segments. A peer that shares memory maps it from the descriptor passed with
// the first message.
struct SendRing {
  static constexpr std::size_t kBytes = (3u << 20) + 123;
  std::unique_ptr<Ring> ring;
  std::unique_ptr<Region> region;
  std::span<std::byte> bytes() const { return ring->memory(); }
};

TEST_P(Conformance, PublishedSegmentsArriveBitExactInOrder) {
  Registry transports(config());
  auto transport = transports.for_address(server_->address());
  ASSERT_OK(transport);
  SendRing ring;
  auto created = (*transport)->allocate_ring(1, SendRing::kBytes);
  ASSERT_OK(created);
  ring.ring = std::move(*created);
  const std::vector<std::byte> expected = pattern(SendRing::kBytes, 7);
  std::copy(expected.begin(), expected.end(), ring.bytes().begin());
  auto region = server_->listener().register_memory(ring.bytes());
  ASSERT_OK(region);
  ring.region = std::move(*region);
  EXPECT_EQ(ring.region == nullptr, GetParam() == Kind::kShm) << "only net registers memory";
  // Two segments of one slot, the second unaligned: each lands where the receiver says.
  const std::size_t split = 4096 + 17;

  PeerThread peer(server_->address(), [&](Channel& ch) -> Status {
    ScopedFd fd;
    auto first = ch.receive_with_fd(kTimeout, &fd);
    if (!first.ok()) return first.status();
    // The peer's own transports: it maps the sender's ring, or receives into one of its own.
    Registry peer_transports(config());
    auto peer_transport = peer_transports.for_address(server_->address());
    if (!peer_transport.ok()) return peer_transport.status();
    auto into_ring =
        ch.shares_memory()
            ? (*peer_transport)->map_peer_ring(std::move(fd), 1, SendRing::kBytes, ch.peer())
            : (*peer_transport)->allocate_ring(1, SendRing::kBytes);
    if (!into_ring.ok()) return into_ring.status();
    const std::span<std::byte> into = (*into_ring)->memory();
    std::unique_ptr<Region> own_region;
    if (!ch.shares_memory()) {
      auto r = ch.register_memory(into);
      if (!r.ok()) return r.status();
      own_region = std::move(*r);
    }
    auto published = ch.receive(kTimeout);  // after the segments were published
    if (!published.ok()) return published.status();
    Status s = ch.receive_segment(into.first(split), own_region.get(), kTimeout);
    if (s.ok()) s = ch.receive_segment(into.subspan(split), own_region.get(), kTimeout);
    if (!s.ok()) return s;
    std::vector<std::byte> answer;
    coding::put_u64(&answer, testing::hash_bytes(std::vector<std::byte>(into.begin(), into.end())));
    return ch.send(answer, kTimeout);
  });
  auto ch = accept();
  ASSERT_NE(ch, nullptr);
  ASSERT_OK(ch->passes_fds() ? ch->send_with_fd(pattern(1, 0), kTimeout, ring.ring->share_fd())
                             : ch->send(pattern(1, 0), kTimeout));
  ASSERT_OK(ch->publish_segment(ring.bytes().first(split), ring.region.get()));
  ASSERT_OK(ch->publish_segment(ring.bytes().subspan(split), ring.region.get()));
  ASSERT_OK(ch->send(pattern(1, 1), kTimeout));
  auto answer = ch->receive(kTimeout);
  ASSERT_OK(answer);
  EXPECT_OK(ch->await_segments(kTimeout));
  EXPECT_OK(ch->check_segments());
  coding::Reader r(*answer);
  EXPECT_EQ(r.u64(), testing::hash_bytes(expected)) << "the segments arrived changed";
  EXPECT_OK(peer.finish(*server_));
}

TEST_P(Conformance, SegmentNotPublishedTimesOutNamingThePeer) {
  PeerThread peer(server_->address(), [](Channel& ch) { return ch.receive(kTimeout).status(); });
  auto ch = accept();
  ASSERT_NE(ch, nullptr);
  std::vector<std::byte> into(4096);
  auto region = ch->register_memory(into);
  ASSERT_OK(region);
  const auto start = Clock::now();
  const Status s = ch->receive_segment(into, region->get(), milliseconds(300));
  if (ch->shares_memory()) {
    // The peer maps this end's memory: there is nothing to wait for.
    EXPECT_OK(s);
    EXPECT_LT(ms_since(start), 100);
  } else {
    EXPECT_EQ(s.code(), Code::kTimeout) << s.to_string();
    EXPECT_NE(s.message().find(ch->peer()), std::string::npos) << s.message();
    EXPECT_GE(ms_since(start), 290);
    EXPECT_LT(ms_since(start), 1500);
  }
  // A timeout is not a failure of the channel.
  ASSERT_OK(ch->send(pattern(1, 2), kTimeout));
  EXPECT_OK(peer.finish(*server_));
}

// ---- a killed peer ----

// This test binary, re-executed as a peer that connects to `address`, says one message and
// then waits to be killed.
class ChildPeer : public testing::Spawned {
 public:
  explicit ChildPeer(const std::string& address)
      : Spawned(testing::self_binary(), {},
                {"FERRY_CONFORMANCE_CHILD=" + address,
                 std::string("FERRY_TOKEN=") + testing::kTestToken}) {}
};

const bool kChildRan = [] {
  const char* address = std::getenv("FERRY_CONFORMANCE_CHILD");
  if (address == nullptr) return false;
  auto ch = connect_alone(address, kTimeout, TransportConfig{});  // the secret: FERRY_TOKEN
  if (!ch.ok() || !(*ch)->send(pattern(5, 3), kTimeout).ok()) std::_Exit(2);
  (void)!::write(1, "connected\n", 10);
  while (true) std::this_thread::sleep_for(std::chrono::seconds(1));
}();

TEST_P(Conformance, KilledPeerIsAbortedPromptlyNamingIt) {
  ChildPeer child(server_->address());
  auto ch = accept();
  ASSERT_NE(ch, nullptr);
  ASSERT_OK(ch->receive(kTimeout));  // its message: it is connected
  ASSERT_EQ(child.read_line(), "connected");
  child.kill();
  const auto start = Clock::now();
  auto m = ch->receive(kTimeout);
  EXPECT_EQ(m.status().code(), Code::kAborted) << m.status().to_string();
  EXPECT_NE(m.status().message().find(ch->peer()), std::string::npos) << m.status().message();
  EXPECT_LT(ms_since(start), 3000);
}

// A caller that connects to something other than a sender (a rank group's root) has its
// errors name the listener as it says.
TEST_P(Conformance, ConnectErrorsNameTheListenerByTheCallersRole) {
  const std::string address =
      GetParam() == Kind::kNet ? testing::unused_loopback_address() : fresh_address(GetParam());
  Registry transports(config());
  auto ch = transports.connect(address, milliseconds(200), "rank 3 (node n1)");
  ASSERT_FALSE(ch.ok());
  EXPECT_EQ(ch.status().code(), Code::kTimeout) << ch.status().to_string();
  EXPECT_NE(ch.status().message().find("rank 3 (node n1)"), std::string::npos)
      << ch.status().message();
  EXPECT_NE(ch.status().message().find(address), std::string::npos) << ch.status().message();
}

INSTANTIATE_TEST_SUITE_P(Transports, Conformance, ::testing::Values(Kind::kShm, Kind::kNet),
                         [](const ::testing::TestParamInfo<Kind>& param) {
                           return param.param == Kind::kShm ? "shm" : "net";
                         });

}  // namespace
}  // namespace ferry::transport
