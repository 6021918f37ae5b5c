// Net sessions refuse weak tokens: the docs' old example "s3cret" was recovered offline from
// one captured handshake in 20,000 guesses (issue #14, item 5).
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

#include "support/status_matchers.h"
#include "support/test_support.h"
#include "transport/net/auth.h"

namespace ferry::net {
namespace {

TEST(TokenStrength, ShortWordsAndRepetitionAreRefusedWithTheFix) {
  for (const char* weak :
       {"s3cret", "right", "test-secret", "password123",
        "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", "abababababababababababab"}) {
    auto t = Token::from_string(weak, "FERRY_TOKEN");
    ASSERT_FALSE(t.ok()) << weak;
    EXPECT_EQ(t.status().code(), Code::kInvalidArgument);
    EXPECT_NE(t.status().message().find("FERRY_TOKEN holds a weak token"), std::string::npos)
        << t.status().message();
    EXPECT_NE(t.status().message().find("ferry token new"), std::string::npos);
    // The message never repeats the secret.
    EXPECT_EQ(t.status().message().find(weak), std::string::npos);
  }
}

TEST(TokenStrength, AtTheLimitAndOnePast) {
  // 22 random-looking lowercase+digit characters: 22 * log2(36) = 113.7 bits, refused;
  // 25 of them: 129.2 bits, accepted.
  EXPECT_LT(estimated_token_bits("k3j9x0q2m7w1z8v4b6n5c0"), kMinTokenBits);
  EXPECT_FALSE(Token::from_string("k3j9x0q2m7w1z8v4b6n5c0").ok());
  EXPECT_GE(estimated_token_bits("k3j9x0q2m7w1z8v4b6n5c0r4t"), kMinTokenBits);
  EXPECT_OK(Token::from_string("k3j9x0q2m7w1z8v4b6n5c0r4t"));
  EXPECT_OK(Token::from_string(ferry::testing::kTestToken));
}

TEST(TokenStrength, NewTokensAreStrongAndDistinct) {
  std::set<std::string> seen;
  for (int i = 0; i < 20; ++i) {
    auto text = new_token_text();
    ASSERT_OK(text);
    EXPECT_EQ(text->size(), 64u);
    // 64 hex digits are 256 bits; a random one may hold a run or repeat of 6 long by chance
    // (about 1 in 20,000 lose some 15 bits for it), never enough to come near the minimum.
    EXPECT_GE(estimated_token_bits(*text), 1.75 * kMinTokenBits) << *text;
    EXPECT_OK(Token::from_string(*text));
    seen.insert(*text);
  }
  EXPECT_EQ(seen.size(), 20u);
}

// Issue 31: the old estimate (length times log2 of the character classes' alphabet) took
// "Summer2024!" three times (recovered from one captured handshake in 4,879 guesses),
// "abcdefgh" four times, and the tests' own "test-token-" with 16 hex digits (64 real bits).
// Each is refused now, and the error says why and how to make a good one.
struct Weak {
  std::string secret;
  std::string why;  // a clause of the error
};

TEST(TokenStrength, RepeatsWordsRunsAndShortHexAfterAFixedPrefixAreRefusedSayingWhy) {
  const std::vector<Weak> weak = {
      {"Summer2024!Summer2024!Summer2024!", "it repeats a block of itself"},
      {"Summer2024!Summer2024!Summer2024!", "common words"},
      {"Summer2024!Summer2024!Summer2024!", "a year"},
      {"abcdefghabcdefghabcdefghabcdefgh", "it repeats a block of itself"},
      {"abcdefghabcdefghabcdefghabcdefgh", "a run such as abcd"},
      {"test-token-5f3a9c2e71b84d06", "16 hex digits, 64 bits"},
      {"ferry-test-token-5f3a9c2e71b84d06", "16 hex digits, 64 bits"},
      {"s3cret-0123456789abcdefghij", "common words"},
      {"P4ssw0rd-Winter-Qwerty-Dragon-2023", "common words"},
  };
  for (const auto& [secret, why] : weak) {
    EXPECT_LT(estimated_token_bits(secret), kMinTokenBits) << secret;
    auto t = Token::from_string(secret, "FERRY_TOKEN");
    ASSERT_FALSE(t.ok()) << secret;
    const std::string& m = t.status().message();
    EXPECT_EQ(t.status().code(), Code::kInvalidArgument);
    EXPECT_NE(m.find("FERRY_TOKEN holds a weak token"), std::string::npos) << m;
    EXPECT_NE(m.find(why), std::string::npos) << secret << ": " << m;
    EXPECT_NE(m.find("ferry token new"), std::string::npos) << m;
    EXPECT_EQ(m.find(secret), std::string::npos) << "the message quotes the secret: " << m;
  }
}

TEST(TokenStrength, HexIsCountedAtFourBitsADigitWhateverSurroundsIt) {
  const std::string hex32 = "8f1c3b9a7e2d4c6b1a0f5e3d2c9b8a7f";  // 128 bits
  EXPECT_NEAR(estimated_token_bits(hex32), 128.0, 0.01);
  // A prefix of words adds little; the same digits after it are still 4 bits each.
  EXPECT_LT(estimated_token_bits("test-token-" + hex32.substr(0, 16)), 100.0);
  EXPECT_GE(estimated_token_bits("test-token-" + hex32), kMinTokenBits);
  // Repeating the hex does not double it.
  EXPECT_LT(estimated_token_bits(hex32.substr(0, 16) + hex32.substr(0, 16)), 90.0);
}

TEST(TokenStrength, TheTestsOwnTokensAreOfTheNewKind) {
  for (const char* t : {ferry::testing::kTestToken, ferry::testing::kOtherTestToken}) {
    EXPECT_EQ(std::string(t).size(), 64u);
    EXPECT_GE(estimated_token_bits(t), 1.75 * kMinTokenBits) << t;
  }
}

}  // namespace
}  // namespace ferry::net
