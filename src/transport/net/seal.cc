#include "transport/net/seal.h"

#include <fmt/format.h>
#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/kdf.h>
#include <openssl/params.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

#include "ferry/wire_protect.h"

namespace ferry {

std::string_view wire_protect_name(WireProtect p) {
  switch (p) {
    case WireProtect::kNone:
      return "none";
    case WireProtect::kMac:
      return "mac";
    case WireProtect::kEncrypt:
      return "encrypt";
  }
  return "unknown";
}

Result<WireProtect> parse_wire_protect(std::string_view text) {
  for (auto p : {WireProtect::kNone, WireProtect::kMac, WireProtect::kEncrypt}) {
    if (text == wire_protect_name(p)) return p;
  }
  return invalid_argument(
      fmt::format("wire protection '{}' is not one of none, mac, encrypt", text));
}

}  // namespace ferry

namespace ferry::net {
namespace {

// EVP's lengths are ints: feed larger spans in pieces.
constexpr std::size_t kChunk = std::size_t{1} << 30;

struct CtxFree {
  void operator()(EVP_CIPHER_CTX* c) const { EVP_CIPHER_CTX_free(c); }
};
using CipherCtx = std::unique_ptr<EVP_CIPHER_CTX, CtxFree>;

const EVP_CIPHER* aes_gcm() {
  // Fetched once: the implicit fetch of EVP_aes_256_gcm() costs a lookup per call.
  static EVP_CIPHER* cipher = EVP_CIPHER_fetch(nullptr, "AES-256-GCM", nullptr);
  return cipher;
}

std::array<unsigned char, 12> gcm_nonce(std::uint64_t counter) {
  std::array<unsigned char, 12> iv{};
  for (int i = 0; i < 8; ++i)
    iv[static_cast<std::size_t>(i)] = static_cast<unsigned char>(counter >> (8 * i));
  return iv;
}

const unsigned char* uc(const std::byte* p) { return reinterpret_cast<const unsigned char*>(p); }
unsigned char* uc(std::byte* p) { return reinterpret_cast<unsigned char*>(p); }

// Runs `update` over `in` (and `out`, when not empty) in kChunk pieces.
template <typename Update>
bool update_all(EVP_CIPHER_CTX* ctx, Update update, std::span<const std::byte> in,
                std::span<std::byte> out) {
  for (std::size_t at = 0; at < in.size(); at += kChunk) {
    const int n = static_cast<int>(std::min(kChunk, in.size() - at));
    int written = 0;
    if (update(ctx, out.empty() ? nullptr : uc(out.data() + at), &written, uc(in.data() + at), n) !=
        1) {
      return false;
    }
  }
  return true;
}

}  // namespace

SessionKeys::~SessionKeys() {
  for (Key* k : {&control_send, &control_receive, &bulk_send, &bulk_receive, &address_send,
                 &address_receive}) {
    OPENSSL_cleanse(k->data(), k->size());
  }
}

void wipe(std::span<std::uint8_t> bytes) { OPENSSL_cleanse(bytes.data(), bytes.size()); }

Result<EphemeralKey> EphemeralKey::generate() {
  EphemeralKey k;
  EVP_PKEY* pkey = EVP_PKEY_Q_keygen(nullptr, nullptr, "X25519");
  if (pkey == nullptr) return internal_error("X25519 key generation failed (EVP_PKEY_Q_keygen)");
  k.pkey_ = pkey;
  std::size_t length = k.public_.size();
  if (EVP_PKEY_get_raw_public_key(pkey, k.public_.data(), &length) != 1 ||
      length != k.public_.size()) {
    return internal_error("X25519 public key export failed (EVP_PKEY_get_raw_public_key)");
  }
  return k;
}

EphemeralKey::EphemeralKey(EphemeralKey&& o) noexcept : pkey_(o.pkey_), public_(o.public_) {
  o.pkey_ = nullptr;
}

EphemeralKey& EphemeralKey::operator=(EphemeralKey&& o) noexcept {
  if (this != &o) {
    EVP_PKEY_free(static_cast<EVP_PKEY*>(pkey_));
    pkey_ = o.pkey_;
    public_ = o.public_;
    o.pkey_ = nullptr;
  }
  return *this;
}

EphemeralKey::~EphemeralKey() { EVP_PKEY_free(static_cast<EVP_PKEY*>(pkey_)); }

Result<SharedSecret> EphemeralKey::agree(const PublicKey& peer_key, const std::string& peer) const {
  struct PkeyFree {
    void operator()(EVP_PKEY* p) const { EVP_PKEY_free(p); }
  };
  struct CtxFree {
    void operator()(EVP_PKEY_CTX* c) const { EVP_PKEY_CTX_free(c); }
  };
  std::unique_ptr<EVP_PKEY, PkeyFree> theirs(
      EVP_PKEY_new_raw_public_key(EVP_PKEY_X25519, nullptr, peer_key.data(), peer_key.size()));
  std::unique_ptr<EVP_PKEY_CTX, CtxFree> ctx(
      EVP_PKEY_CTX_new(static_cast<EVP_PKEY*>(pkey_), nullptr));
  SharedSecret out{};
  std::size_t length = out.size();
  // OpenSSL refuses a peer key whose result is all zeros (a low-order point): derive fails.
  const bool ok = theirs && ctx && EVP_PKEY_derive_init(ctx.get()) == 1 &&
                  EVP_PKEY_derive_set_peer(ctx.get(), theirs.get()) == 1 &&
                  EVP_PKEY_derive(ctx.get(), out.data(), &length) == 1 && length == out.size();
  const bool zero = std::all_of(out.begin(), out.end(), [](std::uint8_t b) { return b == 0; });
  if (!ok || zero) {
    wipe(out);
    return corruption(fmt::format(
        "{} sent an X25519 public key that gives no shared secret (a low-order point: not a "
        "key a ferry peer makes)",
        peer));
  }
  return out;
}

Result<SessionKeys> derive_session_keys(const Token& token, const handshake::Transcript& t,
                                        const SharedSecret& ephemeral, bool is_connector) {
  std::array<unsigned char, 2 * kNonceBytes + 2 * kPublicKeyBytes> salt{};
  auto at = salt.begin();
  at = std::copy(t.connector_nonce.begin(), t.connector_nonce.end(), at);
  at = std::copy(t.listener_nonce.begin(), t.listener_nonce.end(), at);
  at = std::copy(t.connector_key.begin(), t.connector_key.end(), at);
  std::copy(t.listener_key.begin(), t.listener_key.end(), at);
  const auto secret = token.bytes();
  std::vector<unsigned char> ikm(ephemeral.size() + secret.size());
  std::copy(ephemeral.begin(), ephemeral.end(), ikm.begin());
  std::memcpy(ikm.data() + ephemeral.size(), secret.data(), secret.size());
  static const char kInfo[] =
      "ferry wire v2 x25519: control c>l, control l>c, bulk c>l, bulk l>c, address c>l, "
      "address l>c";
  std::array<unsigned char, 6 * kKeyBytes> okm{};

  EVP_KDF* kdf = EVP_KDF_fetch(nullptr, "HKDF", nullptr);
  EVP_KDF_CTX* kctx = kdf == nullptr ? nullptr : EVP_KDF_CTX_new(kdf);
  EVP_KDF_free(kdf);
  if (kctx == nullptr) {
    OPENSSL_cleanse(ikm.data(), ikm.size());
    return internal_error("OpenSSL has no HKDF (EVP_KDF_fetch or EVP_KDF_CTX_new failed)");
  }
  char digest[] = "SHA256";
  OSSL_PARAM params[] = {
      OSSL_PARAM_construct_utf8_string(OSSL_KDF_PARAM_DIGEST, digest, 0),
      OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_KEY, ikm.data(), ikm.size()),
      OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_SALT, salt.data(), salt.size()),
      OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_INFO, const_cast<char*>(kInfo),
                                        sizeof kInfo - 1),
      OSSL_PARAM_construct_end()};
  const int ok = EVP_KDF_derive(kctx, okm.data(), okm.size(), params);
  EVP_KDF_CTX_free(kctx);
  OPENSSL_cleanse(ikm.data(), ikm.size());
  if (ok != 1) return internal_error("HKDF-SHA256 key derivation failed (EVP_KDF_derive)");

  auto key_at = [&](std::size_t i) {
    Key k{};
    std::copy_n(okm.begin() + static_cast<std::ptrdiff_t>(i * kKeyBytes), kKeyBytes, k.begin());
    return k;
  };
  SessionKeys keys;
  // okm = control c>l | control l>c | bulk c>l | bulk l>c | address c>l | address l>c
  keys.control_send = key_at(is_connector ? 0 : 1);
  keys.control_receive = key_at(is_connector ? 1 : 0);
  keys.bulk_send = key_at(is_connector ? 2 : 3);
  keys.bulk_receive = key_at(is_connector ? 3 : 2);
  keys.address_send = key_at(is_connector ? 4 : 5);
  keys.address_receive = key_at(is_connector ? 5 : 4);
  OPENSSL_cleanse(okm.data(), okm.size());
  return keys;
}

Status aead_seal(const Key& key, std::uint64_t counter, std::span<const std::byte> aad,
                 std::span<const std::byte> in, std::span<std::byte> out, Tag* tag) {
  CipherCtx ctx(EVP_CIPHER_CTX_new());
  const auto iv = gcm_nonce(counter);
  unsigned char rest[kTagBytes];  // GCM's final writes nothing; room anyway
  int n = 0;
  if (!ctx || aes_gcm() == nullptr ||
      EVP_EncryptInit_ex(ctx.get(), aes_gcm(), nullptr, key.data(), iv.data()) != 1 ||
      !update_all(ctx.get(), EVP_EncryptUpdate, aad, {}) ||
      !update_all(ctx.get(), EVP_EncryptUpdate, in, out) ||
      EVP_EncryptFinal_ex(ctx.get(), rest, &n) != 1 ||
      EVP_CIPHER_CTX_ctrl(ctx.get(), EVP_CTRL_GCM_GET_TAG, kTagBytes, tag->data()) != 1) {
    return internal_error("AES-256-GCM sealing failed (OpenSSL EVP)");
  }
  return ok_status();
}

bool aead_open(const Key& key, std::uint64_t counter, std::span<const std::byte> aad,
               std::span<const std::byte> in, std::span<std::byte> out, const Tag& tag) {
  CipherCtx ctx(EVP_CIPHER_CTX_new());
  const auto iv = gcm_nonce(counter);
  Tag expected = tag;
  unsigned char rest[kTagBytes];  // GCM's final writes nothing; room anyway
  int n = 0;
  return ctx && aes_gcm() != nullptr &&
         EVP_DecryptInit_ex(ctx.get(), aes_gcm(), nullptr, key.data(), iv.data()) == 1 &&
         update_all(ctx.get(), EVP_DecryptUpdate, aad, {}) &&
         update_all(ctx.get(), EVP_DecryptUpdate, in, out) &&
         EVP_CIPHER_CTX_ctrl(ctx.get(), EVP_CTRL_GCM_SET_TAG, kTagBytes, expected.data()) == 1 &&
         EVP_DecryptFinal_ex(ctx.get(), rest, &n) == 1;
}

Result<std::vector<std::byte>> seal_address(std::span<const std::byte> worker, const Key& key) {
  if (worker.size() < handshake::kMinWorkerAddressBytes ||
      worker.size() > handshake::kMaxWorkerAddressBytes) {
    return internal_error(fmt::format(
        "this process's UCX worker address has {} bytes, outside "
        "the {} to {} an ADDRESS carries",
        worker.size(), handshake::kMinWorkerAddressBytes, handshake::kMaxWorkerAddressBytes));
  }
  std::vector<std::byte> out = handshake::address_header(worker.size());
  const std::size_t header = out.size();
  out.resize(header + worker.size() + kTagBytes);
  Tag tag{};
  const auto body = std::span<std::byte>(out).subspan(header, worker.size());
  Status st = aead_seal(key, 0, std::span<const std::byte>(out).first(header), worker, body, &tag);
  if (!st.ok()) return st;
  std::memcpy(out.data() + header + worker.size(), tag.data(), kTagBytes);
  return out;
}

Result<VerifiedWorkerAddress> open_address(std::span<const std::byte> frame, const Key& key,
                                           std::span<const std::byte> local,
                                           const std::string& peer) {
  auto sealed = handshake::split_address(frame, peer);
  if (!sealed.ok()) return sealed.status();
  Tag tag{};
  std::memcpy(tag.data(), sealed->tag.data(), kTagBytes);
  std::vector<std::byte> worker(sealed->ciphertext.size());
  if (!aead_open(key, 0, sealed->header, sealed->ciphertext, worker, tag)) {
    return corruption(fmt::format(
        "{} sent an ADDRESS that fails its session tag: changed on the way (someone on the path "
        "without the token), or not sealed by the peer that authenticated; refused before UCX "
        "saw it",
        peer));
  }
  Status st = handshake::check_worker_address(worker, local, peer);
  if (!st.ok()) return st;
  return VerifiedWorkerAddress(std::move(worker));
}

}  // namespace ferry::net
