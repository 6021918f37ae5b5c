#include "transport/net/auth.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "base/coding.h"
#include "base/file_util.h"
#include "base/random.h"

namespace ferry::net {

Mac hmac_sha256(std::span<const std::byte> key, std::span<const std::byte> data) {
  Mac out{};
  unsigned int length = 0;
  // The one-shot HMAC() is not deprecated in OpenSSL 3 (only HMAC_CTX is).
  ::HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
         reinterpret_cast<const unsigned char*>(data.data()), data.size(), out.data(), &length);
  return out;
}

bool macs_equal(const Mac& a, const Mac& b) {
  return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

Status random_bytes(std::span<std::uint8_t> out) { return ferry::random_bytes(out); }

Result<Token> Token::from_env() {
  if (const char* value = std::getenv("FERRY_TOKEN"); value != nullptr) {
    if (*value == '\0') return invalid_argument("FERRY_TOKEN is set but empty");
    return from_string(value, "FERRY_TOKEN");
  }
  if (const char* path = std::getenv("FERRY_TOKEN_FILE"); path != nullptr && *path != '\0') {
    return from_file(path);
  }
  return not_found(
      "no session token: set FERRY_TOKEN, or FERRY_TOKEN_FILE to a file with mode 0600, "
      "to the same secret on every node");
}

Result<Token> Token::from_file(const std::string& path) {
  // O_NONBLOCK: a FIFO with no writer would block the open forever; it is refused below.
  ScopedFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK));
  if (!fd.valid()) return errno_status("open token file", path, errno);
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return errno_status("fstat", path, errno);
  if (!S_ISREG(st.st_mode)) {
    return failed_precondition(fmt::format("token file {} is not a regular file", path));
  }
  if (st.st_uid != ::geteuid()) {
    return failed_precondition(fmt::format(
        "token file {} belongs to uid {}, not to this user (uid {}); refusing a secret others "
        "control",
        path, st.st_uid, ::geteuid()));
  }
  if ((st.st_mode & 077) != 0) {
    return failed_precondition(
        fmt::format("token file {} has mode {:04o}: it is readable or writable by group or others; "
                    "run: chmod 600 {}",
                    path, st.st_mode & 07777, path));
  }
  std::string secret;
  char buffer[4096];
  while (true) {
    const ssize_t n = ::read(fd.get(), buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return errno_status("read", path, errno);
    if (n == 0) break;
    secret.append(buffer, static_cast<std::size_t>(n));
    if (secret.size() > (1u << 20)) {
      return invalid_argument(fmt::format("token file {} is larger than 1 MiB", path));
    }
  }
  OPENSSL_cleanse(buffer, sizeof buffer);
  while (!secret.empty() &&
         (secret.back() == '\n' || secret.back() == '\r' || secret.back() == ' ')) {
    secret.pop_back();
  }
  return from_string(std::move(secret), fmt::format("token file {}", path));
}

Result<std::string> new_token_text(std::size_t bytes) {
  std::vector<std::uint8_t> raw(bytes);
  Status st = random_bytes(raw);
  if (!st.ok()) return st;
  std::string text;
  text.reserve(2 * bytes);
  for (const std::uint8_t b : raw) text += fmt::format("{:02x}", b);
  OPENSSL_cleanse(raw.data(), raw.size());
  return text;
}

Result<Token> Token::from_string(std::string secret, std::string source) {
  if (secret.empty()) return invalid_argument(fmt::format("{} holds an empty token", source));
  if (TokenEstimate estimate = estimate_token(secret); estimate.bits < kMinTokenBits) {
    OPENSSL_cleanse(secret.data(), secret.size());
    std::string why;
    for (const auto& w : estimate.weaknesses) why += (why.empty() ? "" : "; ") + w;
    return invalid_argument(fmt::format(
        "{} holds a weak token: about {:.0f} bits by ferry's estimate, at least {:.0f} needed "
        "({}). A captured handshake lets an eavesdropper guess a weak token offline. Make one "
        "with `ferry token new` (256 random bits to ~/.ferry/token; then set "
        "FERRY_TOKEN_FILE=~/.ferry/token on every node) or `openssl rand -hex 32`",
        source, estimate.bits, kMinTokenBits, why));
  }
  return Token(std::move(secret), std::move(source));
}

Token::~Token() { wipe(); }

void Token::wipe() {
  if (!secret_.empty()) OPENSSL_cleanse(secret_.data(), secret_.size());
}

namespace handshake {
namespace {

constexpr std::size_t kPrefixBytes = 6;  // magic, version, kind

class Writer {
 public:
  explicit Writer(Kind kind) {
    u32(kMagic);
    u8(kVersion);
    u8(static_cast<std::uint8_t>(kind));
  }
  // Each returns the writer, so that a message is written in one expression.
  Writer& u8(std::uint8_t v) {
    coding::put_u8(&out_, v);
    return *this;
  }
  Writer& u32(std::uint32_t v) {
    coding::put_u32(&out_, v);
    return *this;
  }
  template <std::size_t N>
  Writer& bytes(const std::array<std::uint8_t, N>& a) {
    for (auto b : a) u8(b);
    return *this;
  }
  std::vector<std::byte> take() { return std::move(out_); }

 private:
  std::vector<std::byte> out_;
};

class Reader {
 public:
  Reader(std::span<const std::byte> in, Kind kind, std::size_t body, const std::string& peer)
      : in_(in) {
    const char* name = kind == Kind::kHello       ? "HELLO"
                       : kind == Kind::kChallenge ? "CHALLENGE"
                       : kind == Kind::kProof     ? "PROOF"
                       : kind == Kind::kVerdict   ? "VERDICT"
                       : kind == Kind::kConfirm   ? "CONFIRM"
                                                  : "ADDRESS";
    if (in.size() != kPrefixBytes + body) {
      error_ = corruption(fmt::format(
          "{} sent {} bytes where the ferry auth handshake expects a {} of {} bytes (not a "
          "ferry peer, or another version?)",
          peer, in.size(), name, kPrefixBytes + body));
      return;
    }
    const std::uint32_t magic = u32();
    const std::uint8_t version = u8();
    const std::uint8_t got = u8();
    if (magic != kMagic || version != kVersion || got != static_cast<std::uint8_t>(kind)) {
      error_ = corruption(fmt::format(
          "{} sent no ferry auth {} (magic {:#x}, version {}, kind {}; expected {:#x}, {}, {})",
          peer, name, magic, version, got, kMagic, kVersion, static_cast<int>(kind)));
    }
  }
  const Status& error() const { return error_; }
  // The constructor checked the size: every read of the body has its bytes.
  std::uint8_t u8() { return in_.u8(); }
  std::uint32_t u32() { return in_.u32(); }
  template <std::size_t N>
  void bytes(std::array<std::uint8_t, N>* a) {
    for (auto& b : *a) b = u8();
  }

 private:
  coding::Reader in_;
  Status error_;
};

Mac proof(const Token& token, std::string_view label, const Transcript& t) {
  std::vector<std::byte> data;
  data.reserve(label.size() + 2 * kNonceBytes + 2 * kPublicKeyBytes);
  for (char c : label) data.push_back(static_cast<std::byte>(c));
  for (const auto* part : {&t.connector_nonce, &t.listener_nonce}) {
    for (auto b : *part) data.push_back(static_cast<std::byte>(b));
  }
  for (const auto* part : {&t.connector_key, &t.listener_key}) {
    for (auto b : *part) data.push_back(static_cast<std::byte>(b));
  }
  return hmac_sha256(token.bytes(), data);
}

}  // namespace

std::vector<std::byte> encode(const Hello& m) {
  return Writer(Kind::kHello).u8(m.has_token ? 1 : 0).bytes(m.nonce).bytes(m.key).take();
}

std::vector<std::byte> encode(const Challenge& m) {
  return Writer(Kind::kChallenge).u8(m.status).bytes(m.nonce).bytes(m.key).take();
}

std::vector<std::byte> encode(const Proof& m) {
  return Writer(Kind::kProof).bytes(m.mac).u32(m.bulk_id).take();
}

std::vector<std::byte> encode(const Verdict& m) {
  return Writer(Kind::kVerdict).u8(m.status).bytes(m.mac).u32(m.bulk_id).take();
}

std::vector<std::byte> encode(const Confirm& m) {
  return Writer(Kind::kConfirm).u8(m.status).take();
}

std::vector<std::byte> address_header(std::size_t worker_bytes) {
  return Writer(Kind::kAddress).u32(static_cast<std::uint32_t>(worker_bytes)).take();
}

Result<Hello> decode_hello(std::span<const std::byte> bytes, const std::string& peer) {
  Reader r(bytes, Kind::kHello, 1 + kNonceBytes + kPublicKeyBytes, peer);
  if (!r.error().ok()) return r.error();
  Hello m;
  const std::uint8_t flag = r.u8();
  if (flag > 1) return corruption(fmt::format("{} sent a HELLO with flag {}", peer, flag));
  m.has_token = flag == 1;
  r.bytes(&m.nonce);
  r.bytes(&m.key);
  return m;
}

Result<Challenge> decode_challenge(std::span<const std::byte> bytes, const std::string& peer) {
  Reader r(bytes, Kind::kChallenge, 1 + kNonceBytes + kPublicKeyBytes, peer);
  if (!r.error().ok()) return r.error();
  Challenge m;
  m.status = r.u8();
  r.bytes(&m.nonce);
  r.bytes(&m.key);
  return m;
}

Result<Proof> decode_proof(std::span<const std::byte> bytes, const std::string& peer) {
  Reader r(bytes, Kind::kProof, kMacBytes + 4, peer);
  if (!r.error().ok()) return r.error();
  Proof m;
  r.bytes(&m.mac);
  m.bulk_id = r.u32();
  return m;
}

Result<Verdict> decode_verdict(std::span<const std::byte> bytes, const std::string& peer) {
  Reader r(bytes, Kind::kVerdict, 1 + kMacBytes + 4, peer);
  if (!r.error().ok()) return r.error();
  Verdict m;
  m.status = r.u8();
  r.bytes(&m.mac);
  m.bulk_id = r.u32();
  return m;
}

Result<Confirm> decode_confirm(std::span<const std::byte> bytes, const std::string& peer) {
  Reader r(bytes, Kind::kConfirm, 1, peer);
  if (!r.error().ok()) return r.error();
  Confirm m;
  m.status = r.u8();
  return m;
}

Result<SealedAddress> split_address(std::span<const std::byte> bytes, const std::string& peer) {
  // The body is a length, that many bytes and a tag: read the length first, bounded, then
  // check the prefix and the exact size as for the fixed messages.
  std::size_t length = 0;
  if (bytes.size() >= kAddressHeaderBytes) {
    length = coding::Reader(bytes.subspan(kPrefixBytes)).u32();
  }
  if (length < kMinWorkerAddressBytes || length > kMaxWorkerAddressBytes) {
    return corruption(
        fmt::format("{} sent an ADDRESS of {} bytes; a UCX worker address has {} to {} bytes", peer,
                    length, kMinWorkerAddressBytes, kMaxWorkerAddressBytes));
  }
  Reader r(bytes, Kind::kAddress, 4 + length + kAddressTagBytes, peer);
  if (!r.error().ok()) return r.error();
  SealedAddress m;
  m.header = bytes.first(kAddressHeaderBytes);
  m.ciphertext = bytes.subspan(kAddressHeaderBytes, length);
  m.tag = bytes.subspan(kAddressHeaderBytes + length);
  return m;
}

std::span<const std::byte> tcp_path_address() {
  static constexpr char kMarker[] = "ferry/tcp1";  // kMinWorkerAddressBytes, no UCX header
  static_assert(sizeof(kMarker) - 1 == kMinWorkerAddressBytes);
  return std::as_bytes(std::span<const char>(kMarker, sizeof(kMarker) - 1));
}

Status check_worker_address(std::span<const std::byte> remote, std::span<const std::byte> local,
                            const std::string& peer) {
  const auto is_tcp = [](std::span<const std::byte> a) {
    return std::ranges::equal(a, tcp_path_address());
  };
  if (is_tcp(remote) != is_tcp(local)) {
    return failed_precondition(fmt::format(
        "{} moves bulk bytes over {}, this end over {}: set FERRY_NET_PATH alike on both ends",
        peer, is_tcp(remote) ? "ferry's TCP path" : "UCX",
        is_tcp(local) ? "ferry's TCP path (FERRY_NET_PATH=tcp, the default)"
                      : "UCX (FERRY_NET_PATH=ucx)"));
  }
  if (is_tcp(local)) return ok_status();
  if (remote.size() < kMinWorkerAddressBytes || remote.size() > kMaxWorkerAddressBytes) {
    return corruption(
        fmt::format("{} sent a UCX worker address of {} bytes; one has {} to {} bytes", peer,
                    remote.size(), kMinWorkerAddressBytes, kMaxWorkerAddressBytes));
  }
  // UCX's address header: the format version in the low 4 bits, flags above. UCX asserts
  // (aborts the process) on a version it does not pack itself.
  const auto version = [](std::span<const std::byte> a) {
    return a.empty() ? -1 : static_cast<int>(std::to_integer<unsigned>(a[0]) & 0x0fu);
  };
  if (version(remote) != version(local)) {
    return corruption(fmt::format(
        "{} sent a UCX worker address of format version {}, where this process's UCX packs "
        "version {} (another UCX release there, or not a worker address)",
        peer, version(remote), version(local)));
  }
  return ok_status();
}

Mac listener_proof(const Token& token, const Transcript& t) {
  return proof(token, "ferry-auth-v2 listener", t);
}

Mac connector_proof(const Token& token, const Transcript& t) {
  return proof(token, "ferry-auth-v2 connector", t);
}

}  // namespace handshake
}  // namespace ferry::net
