// The UCX net transport on 127.0.0.1 with ephemeral ports: control messages, bulk
// transfers into registered memory, authentication, and peers that die or go silent.
//
// Peers run on threads with their own Context, or as child processes (this binary
// re-executed with FERRY_NET_TEST_CHILD set) when the test kills them.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "base/clock.h"
#include "support/status_matchers.h"
#include "support/test_support.h"
#include "transport/net/address.h"
#include "transport/net/channel.h"
#include "transport/net_test_util.h"

namespace ferry::net {
namespace {

using std::chrono::milliseconds;

using test_util::kTimeout;
using test_util::make_context;
using test_util::pattern;
using test_util::token;

double ms_since(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

// A peer on its own thread and Context, which connects to `address` and runs `body`.
class PeerThread {
 public:
  PeerThread(std::string address, std::optional<Token> tok, std::function<Status(Channel&)> body)
      : thread_([this, address = std::move(address), tok = std::move(tok), body = std::move(body)] {
          auto ctx = Context::create();
          if (!ctx.ok()) {
            connect_status_ = ctx.status();
            finished_ = true;
            return;
          }
          auto ch = connect(*ctx, address, tok, kTimeout);
          if (!ch.ok()) {
            connect_status_ = ch.status();
            finished_ = true;
            return;
          }
          transports_ = ch->transports();
          body_status_ = body(*ch);
          ch->close();
          finished_ = true;
        }) {}
  ~PeerThread() { join(); }
  void join() {
    if (thread_.joinable()) thread_.join();
  }
  const Status& connect_status() {
    join();
    return connect_status_;
  }
  const Status& body_status() {
    join();
    return body_status_;
  }
  // Joins while progressing `ctx`, so that a peer closing its end (which flushes to us)
  // is not kept waiting by this thread.
  const Status& finish(Context& ctx) {
    while (!finished_) ctx.wait(milliseconds(10));
    return body_status();
  }

 private:
  Status connect_status_;
  Status body_status_;
  std::atomic<bool> finished_{false};
  std::string transports_;
  std::thread thread_;
};

Listener bind_listener(const std::shared_ptr<Context>& ctx, Token tok = token(),
                       ListenerOptions options = {}) {
  auto l = Listener::bind(ctx, "127.0.0.1:0", std::move(tok), options);
  EXPECT_OK(l);
  return std::move(*l);
}

// A listener whose refusals are recorded (accept() logs them and goes on waiting).
struct RecordingListener {
  std::shared_ptr<std::vector<Status>> refused = std::make_shared<std::vector<Status>>();
  Listener listener;
  RecordingListener(const std::shared_ptr<Context>& ctx, Token tok = token(),
                    ListenerOptions options = {}) {
    auto sink = refused;
    options.on_refused = [sink](const Status& s) { sink->push_back(s); };
    listener = bind_listener(ctx, std::move(tok), options);
  }
  // accept() until one refusal is recorded or `limit` passes; the refusal, or OK if none.
  Status next_refusal(milliseconds limit = kTimeout) {
    const auto deadline = Clock::now() + limit;
    while (refused->empty() && Clock::now() < deadline) {
      auto ch = listener.accept(milliseconds(50));
      EXPECT_FALSE(ch.ok()) << "no peer here should be accepted";
    }
    if (refused->empty()) return ok_status();
    Status s = refused->front();
    refused->erase(refused->begin());
    return s;
  }
};

// A raw TCP client: connects to `address`, sends `bytes`, keeps the socket until destroyed.
class RawClient {
 public:
  RawClient(const std::string& address, const std::vector<std::byte>& bytes) {
    auto addr = resolve(address, false);
    fd_ = ::socket(addr->get()->sa_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (::connect(fd_, addr->get(), addr->length) != 0) return;
    if (!bytes.empty()) (void)::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL);
  }
  ~RawClient() {
    if (fd_ >= 0) ::close(fd_);
  }
  int fd() const { return fd_; }

 private:
  int fd_ = -1;
};

// ---- child processes ----

// This test binary, re-executed as a peer in `role`; killed on destruction.
class ChildProcess : public ferry::testing::Spawned {
 public:
  ChildProcess(const std::string& role, const std::string& address)
      : Spawned(ferry::testing::self_binary(), {},
                {"FERRY_NET_TEST_CHILD=" + role, "FERRY_NET_TEST_ADDR=" + address,
                 std::string("FERRY_TOKEN=") + ferry::testing::kTestToken}) {}
};

void say(const std::string& line) {
  const std::string s = line + "\n";
  (void)!::write(1, s.data(), s.size());
}

// Connects and streams 1 MiB bulk messages (keys 0, 1, ...) until killed.
int child_bulk_sender(const std::string& address) {
  auto ctx = Context::create();
  if (!ctx.ok()) return 1;
  auto ch = connect(*ctx, address, Token::from_env().value(), kTimeout);
  if (!ch.ok()) return 2;
  std::vector<std::byte> buffer = pattern(1 << 20, 1);
  auto region = (*ctx)->register_memory(buffer);
  if (!region.ok()) return 3;
  say("connected");
  for (std::uint32_t key = 0;; ++key) {
    auto t = ch->send_bulk(key, buffer, *region);
    if (!t.ok() || !ch->wait(*t, kTimeout).ok()) return 4;
  }
}

// Listens, prints its address, accepts one peer, takes one bulk message and then stops
// reading (so the peer's sends stay in flight) until killed.
int child_stalled_receiver() {
  auto ctx = Context::create();
  if (!ctx.ok()) return 1;
  auto l = Listener::bind(*ctx, "127.0.0.1:0", Token::from_env().value());
  if (!l.ok()) return 2;
  say(l->address());
  auto ch = l->accept(kTimeout);
  if (!ch.ok()) return 3;
  std::vector<std::byte> buffer(1 << 20);
  auto region = (*ctx)->register_memory(buffer);
  auto t = ch->receive_bulk(0, buffer, *region);
  if (!region.ok() || !t.ok() || !ch->wait(*t, kTimeout).ok()) return 4;
  say("got one");
  while (true) std::this_thread::sleep_for(std::chrono::seconds(1));
}

const bool kChildRan = [] {
  const char* role = std::getenv("FERRY_NET_TEST_CHILD");
  if (role == nullptr) return false;
  const char* address = std::getenv("FERRY_NET_TEST_ADDR");
  int rc = 100;
  if (std::strcmp(role, "bulk-sender") == 0) rc = child_bulk_sender(address);
  if (std::strcmp(role, "stalled-receiver") == 0) rc = child_stalled_receiver();
  std::_Exit(rc);
}();

// ---- tests ----

// Control messages up to the limit, a silent peer's receive deadline and a peer's close are
// promises of every transport: tests/transport/conformance_test.cc.

TEST(NetChannel, BulkBucketArrivesBitExactIntoRegisteredMemory) {
  auto ctx = make_context();
  Listener l = bind_listener(ctx);
  constexpr std::size_t kBucket = (4u << 20) + 12345;
  const auto data = pattern(kBucket, 7);
  PeerThread peer(l.address(), token(), [&](Channel& ch) -> Status {
    std::vector<std::byte> ring(2 * kBucket);  // send from the ring's second slot
    std::memcpy(ring.data() + kBucket, data.data(), kBucket);
    auto region = ch.context().register_memory(ring);
    if (!region.ok()) return region.status();
    auto t = ch.send_bulk(5, std::span<const std::byte>(ring).subspan(kBucket), *region);
    if (!t.ok()) return t.status();
    Status s = ch.wait(*t, kTimeout);
    if (!s.ok()) return s;
    return ch.receive(kTimeout).status();  // stay until the receiver says it is done
  });
  auto ch = l.accept(kTimeout);
  ASSERT_OK(ch);
  std::vector<std::byte> ring(3 * kBucket, std::byte{0xee});
  auto region = ctx->register_memory(ring);
  ASSERT_OK(region);
  auto into = std::span<std::byte>(ring).subspan(kBucket, kBucket);
  auto t = ch->receive_bulk(5, into, *region);
  ASSERT_OK(t);
  ASSERT_OK(ch->wait(*t, kTimeout)) << t->status().to_string();
  EXPECT_EQ(t->bytes(), kBucket);
  EXPECT_EQ(ferry::testing::hash_bytes(into), ferry::testing::hash_bytes(data));
  EXPECT_EQ(ring[kBucket - 1], std::byte{0xee});  // nothing written outside the slot
  EXPECT_EQ(ring[2 * kBucket], std::byte{0xee});
  ASSERT_OK(ch->send(std::vector<std::byte>(1), kTimeout));
  EXPECT_OK(peer.finish(*ctx)) << peer.body_status().to_string();
  // Memory outside the region is refused before anything is sent.
  std::vector<std::byte> outside(16);
  EXPECT_EQ(ch->receive_bulk(6, outside, *region).status().code(), Code::kInvalidArgument);
}

TEST(NetChannel, SeveralBucketsInFlightEachArriveWhole) {
  auto ctx = make_context();
  Listener l = bind_listener(ctx);
  constexpr std::size_t kSlot = 1 << 20;
  constexpr std::uint32_t kSlots = 4;
  constexpr std::uint32_t kBuckets = 16;
  PeerThread peer(l.address(), token(), [&](Channel& ch) -> Status {
    std::vector<std::byte> ring(kSlots * kSlot);
    auto region = ch.context().register_memory(ring);
    if (!region.ok()) return region.status();
    std::array<Transfer, kSlots> in_flight;
    for (std::uint32_t b = 0; b < kBuckets; ++b) {
      const std::uint32_t slot = b % kSlots;
      if (b >= kSlots) {  // reuse a slot only once its previous send completed
        Status s = ch.wait(in_flight[slot], kTimeout);
        if (!s.ok()) return s;
      }
      const auto bytes = pattern(kSlot - b, b);  // distinct sizes: a mix-up is visible
      std::memcpy(ring.data() + slot * kSlot, bytes.data(), bytes.size());
      auto t = ch.send_bulk(b, std::span<const std::byte>(ring).subspan(slot * kSlot, bytes.size()),
                            *region);
      if (!t.ok()) return t.status();
      in_flight[slot] = std::move(*t);
    }
    for (auto& t : in_flight) {
      Status s = ch.wait(t, kTimeout);
      if (!s.ok()) return s;
    }
    return ch.receive(kTimeout).status();
  });
  auto ch = l.accept(kTimeout);
  ASSERT_OK(ch);
  std::vector<std::byte> ring(kBuckets * kSlot);
  auto region = ctx->register_memory(ring);
  ASSERT_OK(region);
  std::vector<Transfer> posted;
  // Half are posted before the peer sends them, half after (the first may already be here).
  for (std::uint32_t b = 0; b < kBuckets; b += 2) {
    posted.push_back(
        ch->receive_bulk(b, std::span<std::byte>(ring).subspan(b * kSlot, kSlot), *region).value());
  }
  std::this_thread::sleep_for(milliseconds(50));
  for (std::uint32_t b = 1; b < kBuckets; b += 2) {
    posted.push_back(
        ch->receive_bulk(b, std::span<std::byte>(ring).subspan(b * kSlot, kSlot), *region).value());
  }
  for (auto& t : posted) {
    ASSERT_OK(ch->wait(t, kTimeout)) << t.status().to_string();
    const std::uint32_t b = t.key();
    ASSERT_EQ(t.bytes(), kSlot - b);
    EXPECT_EQ(ferry::testing::hash_bytes(std::span<std::byte>(ring).subspan(b * kSlot, kSlot - b)),
              ferry::testing::hash_bytes(pattern(kSlot - b, b)))
        << "bucket " << b;
  }
  ASSERT_OK(ch->send(std::vector<std::byte>(1), kTimeout));
  EXPECT_OK(peer.finish(*ctx)) << peer.body_status().to_string();
}

TEST(NetChannel, BulkLargerThanThePostedBufferIsCorruption) {
  auto ctx = make_context();
  Listener l = bind_listener(ctx);
  PeerThread peer(l.address(), token(), [&](Channel& ch) -> Status {
    std::vector<std::byte> buf(64 << 10);
    auto region = ch.context().register_memory(buf);
    auto t = ch.send_bulk(1, buf, *region);
    if (!t.ok()) return t.status();
    (void)ch.wait(*t, kTimeout);
    return ch.receive(kTimeout).status();
  });
  auto ch = l.accept(kTimeout);
  ASSERT_OK(ch);
  std::vector<std::byte> small(1024);
  auto region = ctx->register_memory(small);
  auto t = ch->receive_bulk(1, small, *region);
  ASSERT_OK(t);
  const Status s = ch->wait(*t, kTimeout);
  EXPECT_EQ(s.code(), Code::kCorruption) << s.to_string();
  ASSERT_OK(ch->send(std::vector<std::byte>(1), kTimeout));
}

// An authenticated peer that buries a bulk message's announcement behind messages (here
// 5 x 60 MiB) cannot make this end hold them all while it looks for the announcement: past
// 3 x 64 MiB opened and unread the channel fails naming the peer (issue 31).
TEST(NetChannel, APeerFloodingMessagesAheadOfABulkAnnouncementFailsTheChannelNamingIt) {
  auto ctx = make_context();
  Listener l = bind_listener(ctx);
  PeerThread peer(l.address(), token(), [&](Channel& ch) -> Status {
    const std::vector<std::byte> big(60u << 20, std::byte{7});
    for (int i = 0; i < 5; ++i) {
      Status s = ch.send(big, kTimeout);
      if (!s.ok()) return s;
    }
    std::vector<std::byte> bulk(1024, std::byte{1});
    auto region = ch.context().register_memory(bulk);
    if (!region.ok()) return region.status();
    auto t = ch.send_bulk(1, bulk, *region);
    if (!t.ok()) return t.status();
    (void)ch.wait(*t, kTimeout);
    return ch.receive(kTimeout).status();  // ends when the other side gives up on us
  });
  auto ch = l.accept(kTimeout);
  ASSERT_OK(ch);
  std::vector<std::byte> into(1024);
  auto region = ctx->register_memory(into);
  ASSERT_OK(region);
  auto t = ch->receive_bulk(1, into, *region);
  ASSERT_OK(t);
  const Status s = ch->wait(*t, kTimeout);
  EXPECT_EQ(s.code(), Code::kResourceExhausted) << s.to_string();
  EXPECT_NE(s.message().find("not read"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("127.0.0.1:"), std::string::npos) << s.message();
  // The flooder learns at once that this end gave up on it (its bootstrap socket closes),
  // though the receive's Transfer still holds this end's endpoint.
  const auto aborted_at = Clock::now();
  ch->abort();
  EXPECT_EQ(peer.finish(*ctx).code(), Code::kAborted) << peer.body_status().to_string();
  EXPECT_LT(ms_since(aborted_at), 5000.0);
}

TEST(NetChannel, EventFdWakesThePollLoop) {
  auto ctx = make_context();
  Listener l = bind_listener(ctx);
  PeerThread peer(l.address(), token(), [&](Channel& ch) -> Status {
    std::this_thread::sleep_for(milliseconds(200));
    Status s = ch.send(pattern(100, 1), kTimeout);
    if (!s.ok()) return s;
    return ch.receive(kTimeout).status();
  });
  auto ch = l.accept(kTimeout);
  ASSERT_OK(ch);
  // The loop a sender runs over many peers: progress, look, arm, poll.
  const auto start = Clock::now();
  std::optional<std::vector<std::byte>> got;
  int sleeps = 0;
  while (!got && ms_since(start) < 5000) {
    ctx->progress();
    auto m = ch->try_receive();
    ASSERT_OK(m);
    if (*m) {
      got = std::move(*m);
      break;
    }
    if (ctx->arm()) {
      pollfd p{ch->fd(), POLLIN, 0};
      ::poll(&p, 1, 5000);
      ++sleeps;
    }
  }
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->size(), 100u);
  EXPECT_LT(sleeps, 50) << "the loop spun instead of sleeping on the fd";
  ASSERT_OK(ch->send(std::vector<std::byte>(1), kTimeout));
  EXPECT_OK(peer.finish(*ctx)) << peer.body_status().to_string();
}

TEST(NetChannel, TransportsAreReported) {
  auto ctx = make_context();
  Listener l = bind_listener(ctx);
  PeerThread peer(l.address(), token(), [&](Channel& ch) { return ch.receive(kTimeout).status(); });
  auto ch = l.accept(kTimeout);
  ASSERT_OK(ch);
  if (ctx->path() == NetPath::kTcp) {
    EXPECT_EQ(ch->transports(), "tcp (ferry)");
  } else {  // what UCX chose, "tl/device"
    EXPECT_NE(ch->transports(), "unknown");
    EXPECT_NE(ch->transports().find('/'), std::string::npos) << ch->transports();
  }
  EXPECT_FALSE(ctx->resources().empty());
  ASSERT_OK(ch->send(std::vector<std::byte>(1), kTimeout));
}

// ---- authentication ----

TEST(NetAuth, WrongTokenIsRefusedOnBothSidesAndTheListenerStaysUsable) {
  auto ctx = make_context();
  RecordingListener rl(ctx, token(ferry::testing::kTestToken));
  Listener& l = rl.listener;
  {
    PeerThread bad(l.address(), token(ferry::testing::kOtherTestToken),
                   [](Channel&) { return ok_status(); });
    const Status why = rl.next_refusal();
    EXPECT_EQ(why.code(), Code::kUnauthenticated) << why.to_string();
    EXPECT_NE(why.message().find("peer 127.0.0.1:"), std::string::npos);
    EXPECT_NE(why.message().find("failed authentication: wrong token"), std::string::npos)
        << why.message();
    const Status& c = bad.connect_status();
    EXPECT_EQ(c.code(), Code::kUnauthenticated) << c.to_string();
    EXPECT_NE(c.message().find("sender at " + l.address() + " refused our token"),
              std::string::npos)
        << c.message();
  }
  PeerThread good(l.address(), token(ferry::testing::kTestToken),
                  [](Channel& ch) { return ch.receive(kTimeout).status(); });
  auto ch = l.accept(kTimeout);
  ASSERT_OK(ch);
  ASSERT_OK(ch->send(std::vector<std::byte>(1), kTimeout));
  EXPECT_OK(good.finish(*ctx)) << good.body_status().to_string();
}

TEST(NetAuth, MissingTokenIsRefusedOnBothSides) {
  auto ctx = make_context();
  RecordingListener rl(ctx);
  PeerThread none(rl.listener.address(), std::nullopt, [](Channel&) { return ok_status(); });
  const Status why = rl.next_refusal();
  EXPECT_EQ(why.code(), Code::kUnauthenticated);
  EXPECT_NE(why.message().find("has no token"), std::string::npos) << why.message();
  const Status& c = none.connect_status();
  EXPECT_EQ(c.code(), Code::kUnauthenticated);
  EXPECT_NE(c.message().find("we have no session token"), std::string::npos) << c.message();
  EXPECT_NE(c.message().find("FERRY_TOKEN"), std::string::npos);
}

// A listener that does not know the token but pretends to accept any PROOF: a raw TCP
// socket with ferry's handshake messages. Returns the CONFIRM status the connector sent.
class ImpostorListener {
 public:
  ImpostorListener() {
    auto addr = resolve("127.0.0.1:0", true);
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    EXPECT_EQ(::bind(fd_, addr->get(), addr->length), 0);
    EXPECT_EQ(::listen(fd_, 4), 0);
    sockaddr_storage ss{};
    socklen_t n = sizeof(ss);
    ::getsockname(fd_, reinterpret_cast<sockaddr*>(&ss), &n);
    address_ = format_address(reinterpret_cast<const sockaddr*>(&ss));
    thread_ = std::thread([this] { run(); });
  }
  ~ImpostorListener() {
    if (thread_.joinable()) thread_.join();
    ::close(fd_);
  }
  const std::string& address() const { return address_; }
  int confirm_status() {
    if (thread_.joinable()) thread_.join();
    return confirm_status_;
  }

 private:
  std::vector<std::byte> read_frame(int c) {
    std::uint32_t len = 0;
    if (::recv(c, &len, 4, MSG_WAITALL) != 4 || len > 4096) return {};
    std::vector<std::byte> out(len);
    if (::recv(c, out.data(), len, MSG_WAITALL) != static_cast<ssize_t>(len)) return {};
    return out;
  }
  void send_frame(int c, const std::vector<std::byte>& m) {
    const auto len = static_cast<std::uint32_t>(m.size());
    (void)::send(c, &len, 4, MSG_NOSIGNAL);
    (void)::send(c, m.data(), m.size(), MSG_NOSIGNAL);
  }
  void run() {
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(kTimeout.count())) != 1) return;
    const int c = ::accept(fd_, nullptr, nullptr);
    if (c < 0) return;
    timeval tv{10, 0};
    ::setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    if (handshake::decode_hello(read_frame(c), "connector").ok()) {
      handshake::Challenge challenge;  // a real public key: the MACs are what it cannot make
      auto key = EphemeralKey::generate();
      if (key.ok()) challenge.key = key->public_key();
      send_frame(c, handshake::encode(challenge));
      if (handshake::decode_proof(read_frame(c), "connector").ok()) {
        handshake::Verdict v;  // "accepted", with a MAC it cannot have computed
        v.bulk_id = 1;
        v.mac.fill(0x5a);
        send_frame(c, handshake::encode(v));
        auto confirm = handshake::decode_confirm(read_frame(c), "connector");
        if (confirm.ok()) confirm_status_ = confirm->status;
      }
    }
    ::close(c);
  }

  int fd_ = -1;
  std::string address_;
  int confirm_status_ = -1;
  std::thread thread_;
};

TEST(NetAuth, ListenerThatDoesNotKnowTheTokenIsRejectedByTheConnector) {
  ImpostorListener impostor;
  auto ctx = make_context();
  auto ch = connect(ctx, impostor.address(), token(), kTimeout);
  ASSERT_FALSE(ch.ok());
  EXPECT_EQ(ch.status().code(), Code::kUnauthenticated) << ch.status().to_string();
  EXPECT_NE(ch.status().message().find("sender at " + impostor.address() +
                                       " failed authentication: its proof does not match"),
            std::string::npos)
      << ch.status().message();
  EXPECT_EQ(impostor.confirm_status(), handshake::kBadProof);
}

// ---- failures ----

TEST(NetFailure, ConnectingWhereNobodyListensFailsWithinTheTimeout) {
  auto ctx = make_context();
  std::string address;
  {
    Listener l = bind_listener(ctx);  // find a free port, then free it
    address = l.address();
  }
  const auto start = Clock::now();
  auto ch = connect(ctx, address, token(), milliseconds(700));
  const double took = ms_since(start);
  ASSERT_FALSE(ch.ok());
  EXPECT_EQ(ch.status().code(), Code::kTimeout) << ch.status().to_string();
  EXPECT_NE(ch.status().message().find("could not connect to sender at " + address),
            std::string::npos)
      << ch.status().message();
  EXPECT_GE(took, 600) << "it should retry until the timeout";
  EXPECT_LT(took, 2500);
}

TEST(NetFailure, ListenerThatStartsLateIsReachedByRetrying) {
  auto ctx = make_context();
  std::string address;
  {
    Listener l = bind_listener(ctx);
    address = l.address();
  }
  PeerThread peer(address, token(), [](Channel& ch) { return ch.receive(kTimeout).status(); });
  std::this_thread::sleep_for(milliseconds(300));
  auto l = Listener::bind(ctx, address, token());
  ASSERT_OK(l);
  auto ch = l->accept(kTimeout);
  ASSERT_OK(ch);
  ASSERT_OK(ch->send(std::vector<std::byte>(1), kTimeout));
  EXPECT_OK(peer.finish(*ctx)) << peer.body_status().to_string();
}

TEST(NetFailure, ListenerThatNeverAnswersHitsTheConnectTimeout) {
  auto ctx = make_context();
  Listener l = bind_listener(ctx);  // nobody calls accept(): the handshake never starts
  auto other = make_context();
  const auto start = Clock::now();
  auto ch = connect(other, l.address(), token(), milliseconds(500));
  const double took = ms_since(start);
  ASSERT_FALSE(ch.ok());
  EXPECT_EQ(ch.status().code(), Code::kTimeout) << ch.status().to_string();
  EXPECT_NE(ch.status().message().find(l.address()), std::string::npos) << ch.status().message();
  EXPECT_LT(took, 2000);
}

TEST(NetFailure, PeerThatConnectsAndSaysNothingHitsTheHandshakeTimeout) {
  auto ctx = make_context();
  ListenerOptions options;
  options.handshake_timeout = milliseconds(300);
  RecordingListener rl(ctx, token(), options);
  RawClient silent(rl.listener.address(), {});
  const auto start = Clock::now();
  const Status why = rl.next_refusal();
  const double took = ms_since(start);
  EXPECT_EQ(why.code(), Code::kTimeout) << why.to_string();
  EXPECT_NE(why.message().find("did not finish the handshake within 300 ms"), std::string::npos)
      << why.message();
  EXPECT_LT(took, 3000);
}

TEST(NetAuth, PayloadBeforeTheHandshakeIsRefused) {
  auto ctx = make_context();
  RecordingListener rl(ctx);
  // A well-formed frame of ten bytes where the HELLO should be.
  std::vector<std::byte> frame = {std::byte{10}, std::byte{0}, std::byte{0}, std::byte{0}};
  for (int i = 0; i < 10; ++i) frame.push_back(std::byte{'x'});
  RawClient rude(rl.listener.address(), frame);
  const Status why = rl.next_refusal();
  EXPECT_EQ(why.code(), Code::kCorruption) << why.to_string();
  EXPECT_NE(why.message().find("peer 127.0.0.1:"), std::string::npos);
  EXPECT_NE(why.message().find("HELLO"), std::string::npos) << why.message();
}

TEST(NetAuth, OversizedFrameBeforeTheHandshakeIsNotBuffered) {
  auto ctx = make_context();
  RecordingListener rl(ctx);
  // Announces 64 MiB: refused from the length alone, before any of it is read.
  std::vector<std::byte> frame = {std::byte{0}, std::byte{0}, std::byte{0}, std::byte{4}};
  RawClient rude(rl.listener.address(), frame);
  const Status why = rl.next_refusal();
  EXPECT_EQ(why.code(), Code::kCorruption) << why.to_string();
  EXPECT_NE(why.message().find("the limit here is 256"), std::string::npos) << why.message();
}

TEST(NetFailure, SenderKilledMidTransferIsAbortedPromptlyNamingThePeer) {
  auto ctx = make_context();
  Listener l = bind_listener(ctx);
  ChildProcess child("bulk-sender", l.address());
  auto ch = l.accept(kTimeout);
  ASSERT_OK(ch);
  std::vector<std::byte> buffer(1 << 20);
  auto region = ctx->register_memory(buffer);
  ASSERT_OK(region);
  // The child's connect() finishes only once our worker answers its wire-up, so the first
  // receives (which progress the worker) come before waiting for its "connected" line.
  std::uint32_t key = 0;
  for (; key < 3; ++key) {
    auto t = ch->receive_bulk(key, buffer, *region);
    ASSERT_OK(t);
    ASSERT_OK(ch->wait(*t, kTimeout)) << t->status().to_string();
    ASSERT_EQ(ferry::testing::hash_bytes(buffer), ferry::testing::hash_bytes(pattern(1 << 20, 1)));
  }
  ASSERT_EQ(child.read_line(), "connected");
  child.kill();
  const auto start = Clock::now();
  Status s;
  for (; s.ok() && key < 100000; ++key) {  // the child may have sent some more before it died
    auto t = ch->receive_bulk(key, buffer, *region);
    s = t.ok() ? ch->wait(*t, kTimeout) : t.status();
  }
  EXPECT_EQ(s.code(), Code::kAborted) << s.to_string();
  EXPECT_NE(s.message().find("peer 127.0.0.1:"), std::string::npos) << s.message();
  EXPECT_LT(ms_since(start), 3000);
  EXPECT_EQ(ch->receive(kTimeout).status().code(), Code::kAborted);
}

TEST(NetFailure, ReceiverKilledWithSendsInFlightIsAbortedPromptlyNamingThePeer) {
  auto ctx = make_context();
  ChildProcess child("stalled-receiver", "");
  const std::string address = child.read_line();
  ASSERT_FALSE(address.empty());
  ConnectOptions options;
  options.role = "receiver";
  auto ch = connect(ctx, address, token(), kTimeout, options);
  ASSERT_OK(ch);
  constexpr std::size_t kSlot = 1 << 20;
  std::vector<std::byte> ring(4 * kSlot);
  auto region = ctx->register_memory(ring);
  ASSERT_OK(region);
  auto first = ch->send_bulk(0, std::span<const std::byte>(ring).subspan(0, kSlot), *region);
  ASSERT_OK(first);
  ASSERT_OK(ch->wait(*first, kTimeout)) << first->status().to_string();
  ASSERT_EQ(child.read_line(), "got one");
  std::vector<Transfer> in_flight;
  for (std::uint32_t k = 1; k < 4; ++k) {  // nobody will receive these
    in_flight.push_back(
        ch->send_bulk(k, std::span<const std::byte>(ring).subspan(k * kSlot, kSlot), *region)
            .value());
  }
  child.kill();
  const auto start = Clock::now();
  for (auto& t : in_flight) {
    const Status s = ch->wait(t, kTimeout);
    if (s.ok()) continue;  // buffered by TCP before the kill
    EXPECT_EQ(s.code(), Code::kAborted) << s.to_string();
    EXPECT_NE(s.message().find("receiver at " + address), std::string::npos) << s.message();
  }
  auto m = ch->receive(kTimeout);
  EXPECT_EQ(m.status().code(), Code::kAborted) << m.status().to_string();
  EXPECT_NE(m.status().message().find("receiver at " + address), std::string::npos);
  EXPECT_LT(ms_since(start), 3000);
}

}  // namespace
}  // namespace ferry::net
