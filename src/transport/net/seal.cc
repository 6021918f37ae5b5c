#include "transport/net/seal.h"

#include <fmt/format.h>
#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/kdf.h>
#include <openssl/params.h>

#include <algorithm>
#include <memory>

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
  for (Key* k : {&control_send, &control_receive, &bulk_send, &bulk_receive}) {
    OPENSSL_cleanse(k->data(), k->size());
  }
}

Result<SessionKeys> derive_session_keys(const Token& token, const Nonce& connector,
                                        const Nonce& listener, bool is_connector) {
  std::array<unsigned char, 2 * kNonceBytes> salt{};
  std::copy(connector.begin(), connector.end(), salt.begin());
  std::copy(listener.begin(), listener.end(), salt.begin() + kNonceBytes);
  static const char kInfo[] = "ferry wire v1: control c>l, control l>c, bulk c>l, bulk l>c";
  std::array<unsigned char, 4 * kKeyBytes> okm{};

  EVP_KDF* kdf = EVP_KDF_fetch(nullptr, "HKDF", nullptr);
  if (kdf == nullptr) return internal_error("OpenSSL has no HKDF (EVP_KDF_fetch failed)");
  EVP_KDF_CTX* kctx = EVP_KDF_CTX_new(kdf);
  EVP_KDF_free(kdf);
  if (kctx == nullptr) return internal_error("EVP_KDF_CTX_new failed");
  char digest[] = "SHA256";
  const auto secret = token.bytes();
  OSSL_PARAM params[] = {
      OSSL_PARAM_construct_utf8_string(OSSL_KDF_PARAM_DIGEST, digest, 0),
      OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_KEY, const_cast<std::byte*>(secret.data()),
                                        secret.size()),
      OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_SALT, salt.data(), salt.size()),
      OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_INFO, const_cast<char*>(kInfo),
                                        sizeof kInfo - 1),
      OSSL_PARAM_construct_end()};
  const int ok = EVP_KDF_derive(kctx, okm.data(), okm.size(), params);
  EVP_KDF_CTX_free(kctx);
  if (ok != 1) return internal_error("HKDF-SHA256 key derivation failed (EVP_KDF_derive)");

  auto key_at = [&](std::size_t i) {
    Key k{};
    std::copy_n(okm.begin() + static_cast<std::ptrdiff_t>(i * kKeyBytes), kKeyBytes, k.begin());
    return k;
  };
  SessionKeys keys;
  // okm = control c>l | control l>c | bulk c>l | bulk l>c
  keys.control_send = key_at(is_connector ? 0 : 1);
  keys.control_receive = key_at(is_connector ? 1 : 0);
  keys.bulk_send = key_at(is_connector ? 2 : 3);
  keys.bulk_receive = key_at(is_connector ? 3 : 2);
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

}  // namespace ferry::net
