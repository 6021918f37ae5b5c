// The net transport's authentication pieces: HMAC against RFC 4231, token sources and
// the token file's permission check, and the handshake messages' encoding.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdlib>
#include <string>

#include "support/status_matchers.h"
#include "support/test_support.h"
#include "transport/net/auth.h"

namespace ferry::net {
namespace {

std::string hex(const Mac& mac) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (auto b : mac) {
    out += digits[b >> 4];
    out += digits[b & 15];
  }
  return out;
}

std::span<const std::byte> bytes_of(const std::string& s) {
  return {reinterpret_cast<const std::byte*>(s.data()), s.size()};
}

TEST(Hmac, Rfc4231TestCase1) {
  const std::string key(20, '\x0b');
  EXPECT_EQ(hex(hmac_sha256(bytes_of(key), bytes_of("Hi There"))),
            "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
}

TEST(Hmac, Rfc4231TestCase2) {
  EXPECT_EQ(hex(hmac_sha256(bytes_of("Jefe"), bytes_of("what do ya want for nothing?"))),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
}

TEST(Hmac, Rfc4231TestCase6KeyLongerThanBlock) {
  const std::string key(131, '\xaa');
  EXPECT_EQ(hex(hmac_sha256(bytes_of(key),
                            bytes_of("Test Using Larger Than Block-Size Key - Hash Key First"))),
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
}

TEST(Hmac, MacsEqualComparesEveryByte) {
  Mac a{};
  Mac b{};
  EXPECT_TRUE(macs_equal(a, b));
  b[31] = 1;
  EXPECT_FALSE(macs_equal(a, b));
  b[31] = 0;
  b[0] = 0x80;
  EXPECT_FALSE(macs_equal(a, b));
}

TEST(Token, FileWithMode0600IsReadWithoutTrailingNewline) {
  ferry::testing::TempDir dir;
  const std::string path = dir.file("token");
  ferry::testing::write_bytes(path, std::string(ferry::testing::kTestToken) + "\n");
  ASSERT_EQ(::chmod(path.c_str(), 0600), 0);
  auto t = Token::from_file(path);
  ASSERT_OK(t);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(t->bytes().data()), t->bytes().size()),
            ferry::testing::kTestToken);
  EXPECT_NE(t->source().find(path), std::string::npos);
}

TEST(Token, GroupOrWorldReadableFileIsRefusedWithTheFix) {
  ferry::testing::TempDir dir;
  const std::string path = dir.file("token");
  ferry::testing::write_bytes(path, ferry::testing::kTestToken);
  for (mode_t mode : {0644, 0640, 0604, 0620}) {
    ASSERT_EQ(::chmod(path.c_str(), mode), 0);
    auto t = Token::from_file(path);
    ASSERT_FALSE(t.ok()) << std::oct << mode;
    EXPECT_EQ(t.status().code(), Code::kFailedPrecondition);
    EXPECT_NE(t.status().message().find(path), std::string::npos) << t.status().message();
    EXPECT_NE(t.status().message().find("chmod 600"), std::string::npos) << t.status().message();
  }
  ASSERT_EQ(::chmod(path.c_str(), 0400), 0);
  EXPECT_OK(Token::from_file(path));
}

TEST(Token, MissingOrEmptyFileIsAnError) {
  ferry::testing::TempDir dir;
  auto missing = Token::from_file(dir.file("nope"));
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), Code::kNotFound);
  const std::string path = dir.file("empty");
  ferry::testing::write_bytes(path, "\n");
  ASSERT_EQ(::chmod(path.c_str(), 0600), 0);
  auto empty = Token::from_file(path);
  ASSERT_FALSE(empty.ok());
  EXPECT_EQ(empty.status().code(), Code::kInvalidArgument);
}

// A FIFO (or a device) at the token's path: refused at once, named. Opened blocking, a FIFO
// with no writer hung `sync serve` and `token check` forever (issue 31).
TEST(Token, FifoIsRefusedWithoutBlocking) {
  ferry::testing::TempDir dir;
  const std::string path = dir.file("fifo");
  ASSERT_EQ(::mkfifo(path.c_str(), 0600), 0);
  auto t = Token::from_file(path);
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), Code::kFailedPrecondition);
  EXPECT_NE(t.status().message().find(path + " is not a regular file"), std::string::npos)
      << t.status().message();
}

class TokenEnv : public ::testing::Test {
 protected:
  void SetUp() override {
    ::unsetenv("FERRY_TOKEN");
    ::unsetenv("FERRY_TOKEN_FILE");
  }
  void TearDown() override { SetUp(); }
};

TEST_F(TokenEnv, NeitherVariableIsNotFoundNamingBoth) {
  auto t = Token::from_env();
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), Code::kNotFound);
  EXPECT_NE(t.status().message().find("FERRY_TOKEN"), std::string::npos);
  EXPECT_NE(t.status().message().find("FERRY_TOKEN_FILE"), std::string::npos);
}

TEST_F(TokenEnv, FerryTokenWinsOverTheFile) {
  ferry::testing::TempDir dir;
  const std::string path = dir.file("token");
  ferry::testing::write_bytes(path, ferry::testing::kTestToken);
  ASSERT_EQ(::chmod(path.c_str(), 0600), 0);
  ::setenv("FERRY_TOKEN_FILE", path.c_str(), 1);
  auto f = Token::from_env();
  ASSERT_OK(f);
  EXPECT_EQ(f->source(), "token file " + path);
  EXPECT_EQ(static_cast<char>(f->bytes()[0]), ferry::testing::kTestToken[0]);
  ::setenv("FERRY_TOKEN", ferry::testing::kOtherTestToken, 1);
  auto e = Token::from_env();
  ASSERT_OK(e);
  EXPECT_EQ(static_cast<char>(e->bytes()[0]), ferry::testing::kOtherTestToken[0]);
  EXPECT_EQ(e->source(), "FERRY_TOKEN");
  ::setenv("FERRY_TOKEN", "", 1);
  EXPECT_EQ(Token::from_env().status().code(), Code::kInvalidArgument);
}

TEST_F(TokenEnv, BadModeFileNamedByTheVariableIsRefused) {
  ferry::testing::TempDir dir;
  const std::string path = dir.file("token");
  ferry::testing::write_bytes(path, "x");
  ASSERT_EQ(::chmod(path.c_str(), 0644), 0);
  ::setenv("FERRY_TOKEN_FILE", path.c_str(), 1);
  EXPECT_EQ(Token::from_env().status().code(), Code::kFailedPrecondition);
}

TEST(Handshake, MessagesRoundTrip) {
  handshake::Challenge c;
  c.nonce[0] = 7;
  c.nonce[31] = 9;
  c.key[0] = 11;
  c.key[31] = 13;
  auto d = handshake::decode_challenge(handshake::encode(c), "peer x");
  ASSERT_OK(d);
  EXPECT_EQ(d->nonce, c.nonce);
  EXPECT_EQ(d->key, c.key);
  handshake::Hello h;
  h.has_token = true;
  h.nonce[3] = 5;
  h.key[30] = 17;
  auto e = handshake::decode_hello(handshake::encode(h), "peer x");
  ASSERT_OK(e);
  EXPECT_EQ(e->nonce, h.nonce);
  EXPECT_EQ(e->key, h.key);
  handshake::Verdict v;
  v.status = handshake::kWrongToken;
  v.mac[5] = 42;
  v.bulk_id = 3;
  auto w = handshake::decode_verdict(handshake::encode(v), "peer x");
  ASSERT_OK(w);
  EXPECT_EQ(w->status, handshake::kWrongToken);
  EXPECT_EQ(w->mac, v.mac);
  EXPECT_EQ(w->bulk_id, 3u);
  EXPECT_OK(handshake::decode_confirm(handshake::encode(handshake::Confirm{}), "peer x"));
  handshake::Proof p;
  p.bulk_id = 0xdeadbeef;
  p.mac[0] = 1;
  auto q = handshake::decode_proof(handshake::encode(p), "peer x");
  ASSERT_OK(q);
  EXPECT_EQ(q->bulk_id, 0xdeadbeefu);
  EXPECT_EQ(q->mac, p.mac);
}

TEST(Handshake, DecodeRefusesOtherBytesNamingThePeer) {
  handshake::Hello h;
  h.has_token = true;
  auto bytes = handshake::encode(h);
  EXPECT_OK(handshake::decode_hello(bytes, "peer 1.2.3.4:5"));
  // A HELLO is not a VERDICT, a short message is not a HELLO, nor is another magic.
  EXPECT_EQ(handshake::decode_verdict(bytes, "peer 1.2.3.4:5").status().code(), Code::kCorruption);
  auto shorter = bytes;
  shorter.pop_back();
  auto r = handshake::decode_hello(shorter, "peer 1.2.3.4:5");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("peer 1.2.3.4:5"), std::string::npos);
  auto magic = bytes;
  magic[0] = std::byte{'G'};
  EXPECT_FALSE(handshake::decode_hello(magic, "p").ok());
  auto flag = bytes;
  flag[6] = std::byte{2};
  EXPECT_FALSE(handshake::decode_hello(flag, "p").ok());
}

TEST(Handshake, ProofsDependOnRoleTokenBothNoncesAndBothPublicKeys) {
  auto a = Token::from_string(ferry::testing::kTestToken);
  auto b = Token::from_string(ferry::testing::kOtherTestToken);
  ASSERT_TRUE(a.ok() && b.ok());
  handshake::Transcript t;
  t.listener_nonce[0] = 1;
  t.connector_key[0] = 2;
  t.listener_key[0] = 3;
  const Mac l = handshake::listener_proof(*a, t);
  EXPECT_FALSE(macs_equal(l, handshake::connector_proof(*a, t)));  // no reflection
  EXPECT_FALSE(macs_equal(l, handshake::listener_proof(*b, t)));
  handshake::Transcript swapped = t;
  std::swap(swapped.connector_nonce, swapped.listener_nonce);
  EXPECT_FALSE(macs_equal(l, handshake::listener_proof(*a, swapped)));
  // A public key swapped on the path (by someone without the token) fails the proof.
  for (const int which : {0, 1}) {
    handshake::Transcript other = t;
    (which == 0 ? other.connector_key : other.listener_key)[31] ^= 1;
    EXPECT_FALSE(macs_equal(l, handshake::listener_proof(*a, other))) << which;
  }
  EXPECT_TRUE(macs_equal(l, handshake::listener_proof(*a, t)));
}

}  // namespace
}  // namespace ferry::net
