// Net sessions refuse weak tokens: the docs' old example "s3cret" was recovered offline from
// one captured handshake in 20,000 guesses (issue #14, item 5).
#include <gtest/gtest.h>

#include <set>
#include <string>

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
    EXPECT_GE(estimated_token_bits(*text), 2 * kMinTokenBits);
    EXPECT_OK(Token::from_string(*text));
    seen.insert(*text);
  }
  EXPECT_EQ(seen.size(), 20u);
}

}  // namespace
}  // namespace ferry::net
