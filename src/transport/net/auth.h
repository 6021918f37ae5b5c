// Authentication of net peers: the session token, HMAC-SHA256, and the four
// handshake messages both ends exchange before any other byte (docs/transport-net.md).
//
// Each side proves it knows the token by a MAC over both sides' fresh nonces and a
// label naming its role, so a proof can neither be replayed nor reflected back.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/status.h"
#include "ferry/token.h"

namespace ferry::net {

inline constexpr std::size_t kNonceBytes = 32;
inline constexpr std::size_t kMacBytes = 32;
using Nonce = std::array<std::uint8_t, kNonceBytes>;
using Mac = std::array<std::uint8_t, kMacBytes>;

// HMAC-SHA256 (RFC 2104 / FIPS 198-1) through OpenSSL.
Mac hmac_sha256(std::span<const std::byte> key, std::span<const std::byte> data);
// Constant-time comparison (CRYPTO_memcmp): how long it takes says nothing about the bytes.
bool macs_equal(const Mac& a, const Mac& b);
// Cryptographically random bytes (base/random.h: getrandom).
Status random_bytes(std::span<std::uint8_t> out);

// The least strength a session token may have, in bits (docs/security.md).
inline constexpr double kMinTokenBits = token::kMinBits;

// An estimate of a secret's strength in bits, as ferry/token.h's token::estimated_bits says;
// `ferry token new` makes tokens that pass with room to spare.
double estimated_token_bits(std::string_view secret);

// A fresh token of `bytes` random bytes, hex-encoded (`ferry token new`).
Result<std::string> new_token_text(std::size_t bytes = 32);

// The session secret. Its bytes are wiped when it is destroyed.
class Token {
 public:
  // FERRY_TOKEN when set, else the file named by FERRY_TOKEN_FILE; kNotFound when neither.
  static Result<Token> from_env();
  // The file's contents without trailing newlines or spaces. The file must be owned by this
  // user and have no group or other permission bits (mode 0600 or 0400): kFailedPrecondition
  // otherwise, with the chmod that fixes it.
  static Result<Token> from_file(const std::string& path);
  // kInvalidArgument for an empty secret or one weaker than kMinTokenBits (the message says
  // how to make a strong one).
  static Result<Token> from_string(std::string secret, std::string source = "a token string");

  Token(const Token&) = default;
  Token& operator=(const Token&) = default;
  Token(Token&& o) noexcept = default;
  Token& operator=(Token&& o) noexcept = default;
  ~Token();

  std::span<const std::byte> bytes() const {
    return {reinterpret_cast<const std::byte*>(secret_.data()), secret_.size()};
  }
  // Where it came from ("FERRY_TOKEN", "token file /path"), for messages; never the secret.
  const std::string& source() const { return source_; }

 private:
  Token(std::string secret, std::string source)
      : secret_(std::move(secret)), source_(std::move(source)) {}
  void wipe();
  std::string secret_;
  std::string source_;
};

// The handshake, in order (then ADDRESS both ways): HELLO (connector: nonce) -> CHALLENGE
// (listener: nonce) -> PROOF (connector: its MAC) -> VERDICT (listener: accepted or wrong token,
// and its own MAC)
// -> CONFIRM (connector: the listener's MAC is right). The connector proves itself first so
// that a wrong token is reported as such by both; it sends nothing but handshake messages
// until it has checked the listener's MAC. Each travels as one whole control message.
namespace handshake {

inline constexpr std::uint32_t kMagic = 0x41595246;  // "FRYA" in little-endian bytes
inline constexpr std::uint8_t kVersion = 1;

enum class Kind : std::uint8_t {
  kHello = 1,
  kChallenge = 2,
  kProof = 3,
  kVerdict = 4,
  kConfirm = 5,
  kAddress = 6
};

// Status bytes. Values travel on the wire: never renumber.
inline constexpr std::uint8_t kOk = 0;
inline constexpr std::uint8_t kNoToken = 1;     // CHALLENGE: the connector said it has no token
inline constexpr std::uint8_t kWrongToken = 2;  // VERDICT: the connector's MAC was wrong
inline constexpr std::uint8_t kBadProof = 3;    // CONFIRM: the listener's MAC was wrong

struct Hello {
  bool has_token = false;
  Nonce nonce{};
};
struct Challenge {
  std::uint8_t status = kOk;
  Nonce nonce{};
};
struct Proof {
  Mac mac{};                  // connector_proof(token, hello.nonce, challenge.nonce)
  std::uint32_t bulk_id = 0;  // the tag id the connector receives bulk data under
};
struct Verdict {
  std::uint8_t status = kOk;
  Mac mac{};  // listener_proof(token, hello.nonce, challenge.nonce); zero if refused
  std::uint32_t bulk_id = 0;  // the listener's tag id
};
struct Confirm {
  std::uint8_t status = kOk;
};
// After CONFIRM, each side sends its UCX worker address (ucp_worker_get_address), from
// which the other creates its endpoint. Only authenticated peers get this far.
inline constexpr std::size_t kMaxWorkerAddressBytes = 16384;
struct Address {
  std::vector<std::byte> worker;  // 1 to kMaxWorkerAddressBytes bytes
};

std::vector<std::byte> encode(const Hello& m);
std::vector<std::byte> encode(const Challenge& m);
std::vector<std::byte> encode(const Proof& m);
std::vector<std::byte> encode(const Verdict& m);
std::vector<std::byte> encode(const Confirm& m);
std::vector<std::byte> encode(const Address& m);
// kCorruption naming `peer` when the bytes are not exactly that message.
Result<Hello> decode_hello(std::span<const std::byte> bytes, const std::string& peer);
Result<Challenge> decode_challenge(std::span<const std::byte> bytes, const std::string& peer);
Result<Proof> decode_proof(std::span<const std::byte> bytes, const std::string& peer);
Result<Verdict> decode_verdict(std::span<const std::byte> bytes, const std::string& peer);
Result<Confirm> decode_confirm(std::span<const std::byte> bytes, const std::string& peer);
Result<Address> decode_address(std::span<const std::byte> bytes, const std::string& peer);

// HMAC(token, label || connector nonce || listener nonce), one label per role.
Mac listener_proof(const Token& token, const Nonce& connector, const Nonce& listener);
Mac connector_proof(const Token& token, const Nonce& connector, const Nonce& listener);

}  // namespace handshake
}  // namespace ferry::net
