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
inline constexpr std::size_t kPublicKeyBytes = 32;  // X25519 (RFC 7748)
using Nonce = std::array<std::uint8_t, kNonceBytes>;
using Mac = std::array<std::uint8_t, kMacBytes>;
using PublicKey = std::array<std::uint8_t, kPublicKeyBytes>;

// HMAC-SHA256 (RFC 2104 / FIPS 198-1) through OpenSSL.
Mac hmac_sha256(std::span<const std::byte> key, std::span<const std::byte> data);
// Constant-time comparison (CRYPTO_memcmp): how long it takes says nothing about the bytes.
bool macs_equal(const Mac& a, const Mac& b);
// Cryptographically random bytes (base/random.h: getrandom).
Status random_bytes(std::span<std::uint8_t> out);

// The least strength a session token may have, in bits (docs/security.md).
inline constexpr double kMinTokenBits = token::kMinBits;

// An estimate of a secret's strength in bits (token_strength.cc): the cheapest description
// of it by common words (any case, common substitutions such as 3 for e), runs ("abcd",
// "4321"), blocks repeated, years, hex digits at 4 bits each and decimal digits at 3.3, and
// otherwise length times log2 of the alphabet its character classes span; 0 for fewer than 8
// distinct characters. `ferry token new` makes tokens of 256 bits by it.
struct TokenEstimate {
  double bits = 0;
  // Why it is not more, each a short clause that never quotes the secret ("it repeats a
  // block of itself", "its random-looking part is 16 hex digits, 64 bits, ...").
  std::vector<std::string> weaknesses;
};
TokenEstimate estimate_token(std::string_view secret);
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

// The handshake, in order (then ADDRESS both ways): HELLO (connector: nonce, ephemeral X25519
// public key) -> CHALLENGE (listener: nonce, ephemeral public key) -> PROOF (connector: its MAC) ->
// VERDICT (listener: accepted or wrong token, and its own MAC) -> CONFIRM (connector: the
// listener's MAC is right). The connector proves itself first so that a wrong token is reported as
// such by both; it sends nothing but handshake messages until it has checked the listener's MAC.
// Each travels as one whole control message. ADDRESS, the one message after the MACs, is sealed
// under the session's keys (seal.h: seal_address / open_address), so it is never read before it
// verified.
namespace handshake {

inline constexpr std::uint32_t kMagic = 0x41595246;  // "FRYA" in little-endian bytes
// 2: ephemeral X25519 keys in HELLO and CHALLENGE, under the MACs and mixed into the session
// keys (forward secrecy); ADDRESS sealed under the session keys. 1 had neither.
inline constexpr std::uint8_t kVersion = 2;

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
  PublicKey key{};  // the connector's ephemeral X25519 public key
};
struct Challenge {
  std::uint8_t status = kOk;
  Nonce nonce{};
  PublicKey key{};  // the listener's ephemeral X25519 public key
};
// All the two sides said in clear before the proofs: both MACs cover every byte of it.
struct Transcript {
  Nonce connector_nonce{};
  Nonce listener_nonce{};
  PublicKey connector_key{};
  PublicKey listener_key{};
};
struct Proof {
  Mac mac{};                  // connector_proof(token, transcript)
  std::uint32_t bulk_id = 0;  // the tag id the connector receives bulk data under
};
struct Verdict {
  std::uint8_t status = kOk;
  Mac mac{};                  // listener_proof(token, transcript); zero if refused
  std::uint32_t bulk_id = 0;  // the listener's tag id
};
struct Confirm {
  std::uint8_t status = kOk;
};
// After CONFIRM, each side sends its UCX worker address (ucp_worker_get_address), from
// which the other creates its endpoint, sealed: the frame is the prefix (magic, version,
// kind), the address's length (u32), the address encrypted with AES-256-GCM under the
// sender's address key (SessionKeys), then the 16-byte tag over all of it. Only
// authenticated peers get this far, and only a frame whose tag verifies is read.
//
// The shortest address UCX 1.13 packs: its header byte, the 64-bit worker uuid and the
// end-of-list byte.
inline constexpr std::size_t kMinWorkerAddressBytes = 10;
inline constexpr std::size_t kMaxWorkerAddressBytes = 16384;
inline constexpr std::size_t kAddressHeaderBytes = 10;  // prefix 6 + length 4: the AAD
inline constexpr std::size_t kAddressTagBytes = 16;
struct Address {
  std::vector<std::byte> worker;  // kMinWorkerAddressBytes to kMaxWorkerAddressBytes bytes
};
// An ADDRESS frame cut in its parts, not yet verified: none of it may be used before
// open_address (seal.h) checked the tag.
struct SealedAddress {
  std::span<const std::byte> header;      // kAddressHeaderBytes, authenticated as AAD
  std::span<const std::byte> ciphertext;  // the worker address, encrypted
  std::span<const std::byte> tag;         // kAddressTagBytes
};

// What ferry can check of a peer's UCX worker address before UCX parses it (UCX's own
// unpacking trusts every length in it): its size is within the bounds above, and its header
// names the same UCX address version as `local`, this process's own worker address (a peer
// of another UCX release packs another layout). kCorruption naming `peer` otherwise.
// A Context on ferry's TCP path (NetPath::kTcp) sends this in place of a worker address; the
// two ends' paths must match, which check_worker_address enforces with an error naming
// FERRY_NET_PATH.
std::span<const std::byte> tcp_path_address();
Status check_worker_address(std::span<const std::byte> remote, std::span<const std::byte> local,
                            const std::string& peer);

std::vector<std::byte> encode(const Hello& m);
std::vector<std::byte> encode(const Challenge& m);
std::vector<std::byte> encode(const Proof& m);
std::vector<std::byte> encode(const Verdict& m);
std::vector<std::byte> encode(const Confirm& m);
// kCorruption naming `peer` when the bytes are not exactly that message.
Result<Hello> decode_hello(std::span<const std::byte> bytes, const std::string& peer);
Result<Challenge> decode_challenge(std::span<const std::byte> bytes, const std::string& peer);
Result<Proof> decode_proof(std::span<const std::byte> bytes, const std::string& peer);
Result<Verdict> decode_verdict(std::span<const std::byte> bytes, const std::string& peer);
Result<Confirm> decode_confirm(std::span<const std::byte> bytes, const std::string& peer);
// The parts of an ADDRESS frame: kCorruption naming `peer` when its prefix, length field or
// size is wrong. The spans point into `bytes`.
Result<SealedAddress> split_address(std::span<const std::byte> bytes, const std::string& peer);
// The header of an ADDRESS frame for a worker address of `worker_bytes` bytes.
std::vector<std::byte> address_header(std::size_t worker_bytes);

// HMAC(token, label || connector nonce || listener nonce || connector key || listener key),
// one label per role: a public key swapped on the path fails the proofs.
Mac listener_proof(const Token& token, const Transcript& t);
Mac connector_proof(const Token& token, const Transcript& t);

}  // namespace handshake
}  // namespace ferry::net
