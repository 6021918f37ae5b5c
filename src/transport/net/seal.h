// The net transport's cryptography after the handshake: per-session keys derived from an
// ephemeral X25519 exchange, the token and the handshake's transcript (HKDF-SHA256), and
// AES-256-GCM with a counter nonce, for control frames and bulk transfers
// (docs/security.md, "On the wire").
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

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
  Key address_send{};  // the one ADDRESS frame each end sends (auth.h), counter 0
  Key address_receive{};
  SessionKeys() = default;
  SessionKeys(const SessionKeys&) = default;
  SessionKeys& operator=(const SessionKeys&) = default;
  ~SessionKeys();  // wipes the keys
};

// The X25519 secret both ends compute from their own ephemeral key and the other's public key.
inline constexpr std::size_t kSharedSecretBytes = 32;
using SharedSecret = std::array<std::uint8_t, kSharedSecretBytes>;
// Wipes secret bytes (OPENSSL_cleanse: not optimised away).
void wipe(std::span<std::uint8_t> bytes);
// Wipes the bytes it was given when it goes out of scope, on every path. Not copyable.
class ScopedWipe {
 public:
  explicit ScopedWipe(std::span<std::uint8_t> bytes) : bytes_(bytes) {}
  ScopedWipe(const ScopedWipe&) = delete;
  ScopedWipe& operator=(const ScopedWipe&) = delete;
  ~ScopedWipe() { wipe(bytes_); }

 private:
  std::span<std::uint8_t> bytes_;
};

// One side's ephemeral X25519 key pair (OpenSSL EVP_PKEY), made for one handshake; its
// private half is freed with it. Move-only.
class EphemeralKey {
 public:
  static Result<EphemeralKey> generate();
  EphemeralKey(EphemeralKey&&) noexcept;
  EphemeralKey& operator=(EphemeralKey&&) noexcept;
  ~EphemeralKey();
  const PublicKey& public_key() const { return public_; }
  // The shared secret with the holder of `peer_key`; kCorruption naming `peer` for a key
  // that gives none (a low-order point: the all-zero secret, RFC 7748 section 6.1).
  Result<SharedSecret> agree(const PublicKey& peer_key, const std::string& peer) const;

 private:
  EphemeralKey() = default;
  void* pkey_ = nullptr;  // EVP_PKEY*: OpenSSL stays out of this header
  PublicKey public_{};
};

// HKDF-SHA256(ikm = ephemeral secret || token, salt = connector nonce || listener nonce ||
// connector key || listener key, info = a label per direction and purpose). Both ends derive
// the same six keys, each as its own roles'. The token never travels, and the ephemeral
// secret is forgotten after the handshake: a recorded session opens neither without the
// token (to an eavesdropper) nor with it, later (forward secrecy).
Result<SessionKeys> derive_session_keys(const Token& token, const handshake::Transcript& t,
                                        const SharedSecret& ephemeral, bool is_connector);

// AES-256-GCM with nonce = `counter` (64-bit little-endian, then 4 zero bytes): each key
// never sees a counter twice. seal: `out` (same size as `in`, may be `in`) gets the
// ciphertext, *tag the tag over `aad` and it; with `in` empty it is a MAC of `aad` (GMAC).
Status aead_seal(const Key& key, std::uint64_t counter, std::span<const std::byte> aad,
                 std::span<const std::byte> in, std::span<std::byte> out, Tag* tag);
// The inverse: false when the tag does not match (tampered, reordered, replayed, reflected
// or not from the key's holder); `out` then holds garbage the caller must not use.
bool aead_open(const Key& key, std::uint64_t counter, std::span<const std::byte> aad,
               std::span<const std::byte> in, std::span<std::byte> out, const Tag& tag);

// A peer's UCX worker address that came out of an ADDRESS frame whose tag verified under the
// session's key and whose shape passed handshake::check_worker_address: the only kind
// open_channel (channel.h) hands to UCX. Made by open_address only. Copyable.
class VerifiedWorkerAddress {
 public:
  std::span<const std::byte> bytes() const { return bytes_; }

 private:
  friend Result<VerifiedWorkerAddress> open_address(std::span<const std::byte>, const Key&,
                                                    std::span<const std::byte>, const std::string&);
  explicit VerifiedWorkerAddress(std::vector<std::byte> bytes) : bytes_(std::move(bytes)) {}
  std::vector<std::byte> bytes_;
};

// The ADDRESS frame (auth.h) for this end's worker address, sealed under `key` (this end's
// SessionKeys::address_send) with counter 0: each key seals exactly one frame.
Result<std::vector<std::byte>> seal_address(std::span<const std::byte> worker, const Key& key);
// The inverse, under `key` (SessionKeys::address_receive): the frame's shape, then its tag,
// then the address's shape against `local`, this process's own worker address
// (handshake::check_worker_address). kCorruption naming `peer` for each; no byte of the
// address is looked at before its tag verified.
Result<VerifiedWorkerAddress> open_address(std::span<const std::byte> frame, const Key& key,
                                           std::span<const std::byte> local,
                                           const std::string& peer);

}  // namespace ferry::net
