// What the net transport's tests share: a session token, a context, deterministic bytes.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "support/status_matchers.h"
#include "support/test_support.h"
#include "transport/net/auth.h"
#include "transport/net/context.h"
#include "transport/net/seal.h"

namespace ferry::net::test_util {

inline constexpr std::chrono::milliseconds kTimeout{10000};

inline Token token(const std::string& s = ferry::testing::kTestToken) {
  return *Token::from_string(s);
}

// On the path FERRY_NET_PATH names (ctest runs the net tests once per path), or `path`.
inline std::shared_ptr<Context> make_context(std::optional<NetPath> path = std::nullopt) {
  auto c = Context::create({.path = path});
  EXPECT_OK(c);
  return c.ok() ? *c : nullptr;
}

// Session keys as a handshake with connector nonce `c` and listener nonce `l` (public keys
// zero) and the ephemeral secret 32 x `shared` would give: for tests of the keys themselves.
inline Result<SessionKeys> session_keys(const Token& t, const Nonce& c, const Nonce& l,
                                        bool is_connector, std::uint8_t shared = 3) {
  handshake::Transcript transcript;
  transcript.connector_nonce = c;
  transcript.listener_nonce = l;
  SharedSecret secret{};
  secret.fill(shared);
  return derive_session_keys(t, transcript, secret, is_connector);
}

// n bytes from a generator seeded with `seed`: equal seeds, equal bytes.
inline std::vector<std::byte> pattern(std::size_t n, unsigned seed) {
  std::vector<std::byte> v(n);
  std::mt19937_64 rng(seed);
  for (std::size_t i = 0; i < n; i += 8) {
    const std::uint64_t x = rng();
    std::memcpy(v.data() + i, &x, std::min<std::size_t>(8, n - i));
  }
  return v;
}

}  // namespace ferry::net::test_util
