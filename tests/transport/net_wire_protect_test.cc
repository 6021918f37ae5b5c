// Integrity and privacy on the net wire: per-session keys, sealed control frames, and
// bulk messages under each WireProtect mode, with an attacker on the path played by the
// test-only tamper hooks (transport/net/testing.h).
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "support/status_matchers.h"
#include "support/test_support.h"
#include "transport/net/channel.h"
#include "transport/net/seal.h"
#include "transport/net/testing.h"
#include "transport/net_test_util.h"

namespace ferry::net {
namespace {

using std::chrono::milliseconds;
using test_util::kTimeout;
using test_util::pattern;
using test_util::token;

Nonce nonce(std::uint8_t fill) {
  Nonce n{};
  n.fill(fill);
  return n;
}

// Clears a tamper hook however the test ends.
struct ClearHooks {
  ~ClearHooks() {
    testing::set_control_tamper({});
    testing::set_bulk_tamper({});
  }
};

// A connected pair: `near` accepted here, the peer's end driven by `body` on a thread with
// its own Context.
class Pair {
 public:
  explicit Pair(std::function<Status(Channel&)> body) {
    ctx_ = *Context::create();
    auto listener = Listener::bind(ctx_, "127.0.0.1:0", token());
    listener_ = std::make_unique<Listener>(std::move(*listener));
    thread_ = std::thread([this, body = std::move(body)] {
      auto ctx = Context::create();
      if (!ctx.ok()) {
        peer_status_ = ctx.status();
      } else if (auto ch = connect(*ctx, listener_->address(), token(), kTimeout); !ch.ok()) {
        peer_status_ = ch.status();
      } else {
        peer_status_ = body(*ch);
        ch->abort();
      }
      done_ = true;
    });
    auto ch = listener_->accept(kTimeout);
    EXPECT_OK(ch);
    if (ch.ok()) near = std::move(*ch);
  }
  ~Pair() { finish(); }
  const Status& finish() {
    while (!done_) ctx_->wait(milliseconds(10));
    if (thread_.joinable()) thread_.join();
    return peer_status_;
  }
  Context& context() { return *ctx_; }

  Channel near;

 private:
  std::shared_ptr<Context> ctx_;
  std::unique_ptr<Listener> listener_;
  std::thread thread_;
  std::atomic<bool> done_{false};
  Status peer_status_;
};

TEST(SessionKeys, DifferPerSessionDirectionAndPurposeAndMatchAcrossEnds) {
  const Token t = token();
  auto c = test_util::session_keys(t, nonce(1), nonce(2), /*is_connector=*/true);
  auto l = test_util::session_keys(t, nonce(1), nonce(2), /*is_connector=*/false);
  ASSERT_TRUE(c.ok() && l.ok());
  // What one end sends with, the other opens with.
  EXPECT_EQ(c->control_send, l->control_receive);
  EXPECT_EQ(c->control_receive, l->control_send);
  EXPECT_EQ(c->bulk_send, l->bulk_receive);
  EXPECT_EQ(c->bulk_receive, l->bulk_send);
  // Directions and purposes never share a key (a reflected frame opens under none).
  const std::vector<Key> mine = {c->control_send, c->control_receive, c->bulk_send,
                                 c->bulk_receive};
  for (std::size_t i = 0; i < mine.size(); ++i) {
    for (std::size_t j = i + 1; j < mine.size(); ++j) EXPECT_NE(mine[i], mine[j]) << i << j;
  }
  // Another session (either nonce) or another token: other keys.
  auto other_listener_nonce = test_util::session_keys(t, nonce(1), nonce(3), true);
  auto other_connector_nonce = test_util::session_keys(t, nonce(4), nonce(2), true);
  auto other_token =
      test_util::session_keys(token(ferry::testing::kOtherTestToken), nonce(1), nonce(2), true);
  // Another ephemeral secret, all else equal: other keys. A recorder who later learns the
  // token has the nonces and public keys too, but not this secret (forward secrecy).
  auto other_ephemeral = test_util::session_keys(t, nonce(1), nonce(2), true, /*shared=*/4);
  // And the public keys are in the salt: the same secret under other keys' transcript differs.
  handshake::Transcript swapped;
  swapped.connector_nonce = nonce(1);
  swapped.listener_nonce = nonce(2);
  swapped.listener_key[0] = 1;
  SharedSecret three{};
  three.fill(3);
  auto other_public = derive_session_keys(t, swapped, three, true);
  for (const auto* o : {&other_listener_nonce, &other_connector_nonce, &other_token,
                        &other_ephemeral, &other_public}) {
    ASSERT_TRUE(o->ok());
    EXPECT_NE((*o)->control_send, c->control_send);
    EXPECT_NE((*o)->bulk_send, c->bulk_send);
  }
}

TEST(NetWireProtect, ControlMessagesDoNotTravelInClear) {
  ClearHooks clear;
  const std::string secret = "a control message nobody on the path may read";
  std::atomic<bool> seen_in_clear{false};
  testing::set_control_tamper([&](std::span<std::byte> frame) {
    const std::string_view s(reinterpret_cast<const char*>(frame.data()), frame.size());
    if (s.find("nobody on the path") != std::string_view::npos) seen_in_clear = true;
  });
  Pair pair([&](Channel& ch) -> Status {
    std::vector<std::byte> m(secret.size());
    std::memcpy(m.data(), secret.data(), m.size());
    Status s = ch.send(m, kTimeout);
    if (!s.ok()) return s;
    return ch.receive(kTimeout).status();
  });
  auto got = pair.near.receive(kTimeout);
  ASSERT_OK(got);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(got->data()), got->size()), secret);
  EXPECT_FALSE(seen_in_clear);
  ASSERT_OK(pair.near.send(std::vector<std::byte>(1), kTimeout));
  EXPECT_OK(pair.finish());
}

TEST(NetWireProtect, TamperedControlFrameFailsTheChannelNamingThePeer) {
  ClearHooks clear;
  std::atomic<bool> armed{false};
  testing::set_control_tamper([&](std::span<std::byte> frame) {
    if (armed.exchange(false)) frame[frame.size() / 2] ^= std::byte{0x01};
  });
  Pair pair([&](Channel& ch) -> Status {
    Status s = ch.send(pattern(100, 1), kTimeout);
    if (!s.ok()) return s;
    return ch.receive(kTimeout).status();
  });
  armed = true;
  auto got = pair.near.receive(kTimeout);
  ASSERT_FALSE(got.ok()) << "a tampered message was delivered";
  EXPECT_EQ(got.status().code(), Code::kCorruption) << got.status().to_string();
  EXPECT_NE(got.status().message().find("failed authentication"), std::string::npos)
      << got.status().message();
  EXPECT_NE(got.status().message().find(pair.near.peer()), std::string::npos)
      << got.status().message();
  // The channel stays failed: nothing after a forged frame is believed.
  EXPECT_EQ(pair.near.health().code(), Code::kCorruption);
  pair.near.abort();
  pair.finish();
}

// A frame's nonce is its position in the stream: a copy of an earlier frame (replay) or
// two frames swapped (reorder) fail authentication even though each is a genuine frame.
void expect_refused_when_frames_are(const std::function<void(int, std::span<std::byte>)>& edit) {
  ClearHooks clear;
  std::atomic<int> index{0};
  std::atomic<bool> armed{false};
  testing::set_control_tamper([&](std::span<std::byte> frame) {
    if (armed) edit(index++, frame);
  });
  Pair pair([&](Channel& ch) -> Status {
    for (unsigned i = 0; i < 3; ++i) {
      Status s = ch.send(pattern(64, i), kTimeout);
      if (!s.ok()) return s;
    }
    return ch.receive(kTimeout).status();
  });
  armed = true;
  Status first_error;
  for (int i = 0; i < 3 && first_error.ok(); ++i) {
    auto got = pair.near.receive(kTimeout);
    if (!got.ok()) {
      first_error = got.status();
    } else {
      EXPECT_EQ(*got, pattern(64, static_cast<unsigned>(i))) << "message " << i;
    }
  }
  EXPECT_EQ(first_error.code(), Code::kCorruption) << first_error.to_string();
  EXPECT_NE(first_error.message().find("failed authentication"), std::string::npos)
      << first_error.message();
  pair.near.abort();
  pair.finish();
}

TEST(NetWireProtect, ReplayedControlFrameIsRefused) {
  std::vector<std::byte> first;
  expect_refused_when_frames_are([&](int i, std::span<std::byte> frame) {
    if (i == 0) first.assign(frame.begin(), frame.end());
    if (i == 1) std::memcpy(frame.data(), first.data(), frame.size());  // frame 0 again
  });
}

TEST(Seal, OpensOnlyUnderItsKeyCounterAndAdditionalData) {
  // What reorder, drop and reflection come to: a frame opened at another position (counter)
  // or under the other direction's key.
  auto keys = test_util::session_keys(token(), nonce(1), nonce(2), true);
  ASSERT_OK(keys);
  const auto plain = pattern(100, 6);
  const auto aad = pattern(4, 7);
  std::vector<std::byte> sealed(plain.size());
  Tag tag{};
  ASSERT_OK(aead_seal(keys->control_send, 1, aad, plain, sealed, &tag));
  EXPECT_NE(sealed, plain);
  std::vector<std::byte> out(plain.size());
  EXPECT_TRUE(aead_open(keys->control_send, 1, aad, sealed, out, tag));
  EXPECT_EQ(out, plain);
  EXPECT_FALSE(aead_open(keys->control_send, 0, aad, sealed, out, tag));     // reordered
  EXPECT_FALSE(aead_open(keys->control_send, 2, aad, sealed, out, tag));     // one dropped before
  EXPECT_FALSE(aead_open(keys->control_receive, 1, aad, sealed, out, tag));  // reflected
  auto other_aad = aad;
  other_aad[0] ^= std::byte{1};
  EXPECT_FALSE(aead_open(keys->control_send, 1, other_aad, sealed, out, tag));  // length changed
}

// Sends one bulk message of `bytes` under `mode` from the peer; returns the receive's status
// and, in *received, what landed in the buffer.
Status bulk_round_trip(WireProtect mode, WireProtect minimum, const std::vector<std::byte>& data,
                       std::vector<std::byte>* received) {
  Pair pair([&](Channel& ch) -> Status {
    ch.set_bulk_protection(mode, WireProtect::kNone);
    std::vector<std::byte> ring = data;
    auto region = ch.context().register_memory(ring);
    if (!region.ok()) return region.status();
    auto t = ch.send_bulk(5, ring, *region);
    if (!t.ok()) return t.status();
    Status s = ch.wait(*t, kTimeout);
    if (!s.ok()) return s;
    if (ring != data) return internal_error("send_bulk changed the sender's bytes");
    return ch.receive(kTimeout).status();  // until the receiver is done
  });
  pair.near.set_bulk_protection(WireProtect::kNone, minimum);
  received->assign(data.size(), std::byte{0});
  auto region = pair.context().register_memory(*received);
  if (!region.ok()) return region.status();
  auto t = pair.near.receive_bulk(5, *received, *region);
  if (!t.ok()) return t.status();
  Status s = pair.near.wait(*t, kTimeout);
  (void)pair.near.send(std::vector<std::byte>(1), kTimeout);
  Status peer = pair.finish();
  EXPECT_OK(peer);
  if (s.ok() && !peer.ok()) return peer;
  return s;
}

TEST(NetWireProtect, BulkArrivesBitExactInEveryMode) {
  const auto data = pattern((1u << 20) + 77, 9);
  for (auto mode : {WireProtect::kNone, WireProtect::kMac, WireProtect::kEncrypt}) {
    ClearHooks clear;
    bool in_clear = false;
    testing::set_bulk_tamper([&](std::span<std::byte> bytes) {
      in_clear = std::equal(bytes.begin(), bytes.end(), data.begin(), data.end());
    });
    std::vector<std::byte> got;
    Status s = bulk_round_trip(mode, WireProtect::kNone, data, &got);
    ASSERT_OK(s) << wire_protect_name(mode) << ": " << s.to_string();
    EXPECT_EQ(ferry::testing::hash_bytes(got), ferry::testing::hash_bytes(data))
        << wire_protect_name(mode);
    // What travelled: the bytes themselves, except under encrypt.
    EXPECT_EQ(in_clear, mode != WireProtect::kEncrypt) << wire_protect_name(mode);
  }
}

TEST(NetWireProtect, TamperedBulkByteIsDetectedInMacAndEncryptModes) {
  const auto data = pattern(300000, 3);
  for (auto mode : {WireProtect::kMac, WireProtect::kEncrypt}) {
    ClearHooks clear;
    testing::set_bulk_tamper([](std::span<std::byte> bytes) { bytes[12345] ^= std::byte{0x20}; });
    std::vector<std::byte> got;
    Status s = bulk_round_trip(mode, WireProtect::kNone, data, &got);
    EXPECT_EQ(s.code(), Code::kCorruption) << wire_protect_name(mode) << ": " << s.to_string();
    EXPECT_NE(s.message().find("bulk message 5"), std::string::npos) << s.message();
    EXPECT_NE(s.message().find("failed authentication"), std::string::npos) << s.message();
    EXPECT_NE(s.message().find("peer 127.0.0.1:"), std::string::npos) << s.message();
  }
}

TEST(NetWireProtect, TamperedBulkByteInNoneModeIsNotDetectedByTheTransport) {
  // none is what it says: the transport delivers the changed byte; only the sync layer's
  // XXH3 (on by default) can catch it (NetWireProtectSync tests).
  ClearHooks clear;
  const auto data = pattern(300000, 4);
  testing::set_bulk_tamper([](std::span<std::byte> bytes) { bytes[12345] ^= std::byte{0x20}; });
  std::vector<std::byte> got;
  ASSERT_OK(bulk_round_trip(WireProtect::kNone, WireProtect::kNone, data, &got));
  EXPECT_NE(got, data);
  EXPECT_EQ(got[12345], data[12345] ^ std::byte{0x20});
}

TEST(NetWireProtect, ReceiverRequiringMacRefusesWeakerBulk) {
  const auto data = pattern(4096, 5);
  std::vector<std::byte> got;
  Status s = bulk_round_trip(WireProtect::kNone, WireProtect::kMac, data, &got);
  EXPECT_EQ(s.code(), Code::kFailedPrecondition) << s.to_string();
  EXPECT_NE(s.message().find("'none'"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("at least 'mac'"), std::string::npos) << s.message();
  // encrypt is stronger than mac: accepted.
  EXPECT_OK(bulk_round_trip(WireProtect::kEncrypt, WireProtect::kMac, data, &got));
  EXPECT_EQ(got, data);
}

TEST(WireProtectNames, ParseRoundTripsAndRefusesUnknownNaming) {
  for (auto mode : {WireProtect::kNone, WireProtect::kMac, WireProtect::kEncrypt}) {
    auto p = parse_wire_protect(wire_protect_name(mode));
    ASSERT_OK(p);
    EXPECT_EQ(*p, mode);
  }
  auto bad = parse_wire_protect("hmac");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), Code::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("'hmac'"), std::string::npos);
}

}  // namespace
}  // namespace ferry::net
