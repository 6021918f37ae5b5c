// The net transport's cryptography after the handshake: per-session keys derived from the
// token and both handshake nonces (HKDF-SHA256), and AES-256-GCM with a counter nonce, for
// control frames and bulk transfers (docs/security.md, "On the wire").
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>

#include "ferry/status.h"
#include "transport/net/auth.h"

namespace ferry::net {

inline constexpr std::size_t kKeyBytes = 32;  // AES-256
inline constexpr std::size_t kTagBytes = 16;  // GCM tag
using Key = std::array<std::uint8_t, kKeyBytes>;
using Tag = std::array<std::uint8_t, kTagBytes>;

// One end's keys for one session: one per direction and purpose, so a frame reflected
// back, or a control frame replayed as bulk, opens under no key of the receiver's.
struct SessionKeys {
  Key control_send{};
  Key control_receive{};
  Key bulk_send{};
  Key bulk_receive{};
  SessionKeys() = default;
  SessionKeys(const SessionKeys&) = default;
  SessionKeys& operator=(const SessionKeys&) = default;
  ~SessionKeys();  // wipes the keys
};

// HKDF-SHA256(ikm = token, salt = connector nonce || listener nonce, info = a label per
// direction and purpose). Both ends derive the same four keys, each as its own roles'.
// The token never travels; without it a captured handshake yields no key.
Result<SessionKeys> derive_session_keys(const Token& token, const Nonce& connector,
                                        const Nonce& listener, bool is_connector);

// AES-256-GCM with nonce = `counter` (64-bit little-endian, then 4 zero bytes): each key
// never sees a counter twice. seal: `out` (same size as `in`, may be `in`) gets the
// ciphertext, *tag the tag over `aad` and it; with `in` empty it is a MAC of `aad` (GMAC).
Status aead_seal(const Key& key, std::uint64_t counter, std::span<const std::byte> aad,
                 std::span<const std::byte> in, std::span<std::byte> out, Tag* tag);
// The inverse: false when the tag does not match (tampered, reordered, replayed, reflected
// or not from the key's holder); `out` then holds garbage the caller must not use.
bool aead_open(const Key& key, std::uint64_t counter, std::span<const std::byte> aad,
               std::span<const std::byte> in, std::span<std::byte> out, const Tag& tag);

}  // namespace ferry::net
