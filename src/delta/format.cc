#include "delta/format.h"

#include <xxhash.h>

#include <string>

#include "base/coding.h"

namespace ferry::delta {
namespace {

std::uint64_t checksum(std::span<const std::byte> header_prefix, std::span<const std::byte> body) {
  const std::uint64_t seed = XXH3_64bits(header_prefix.data(), header_prefix.size());
  return XXH3_64bits_withSeed(body.data(), body.size(), seed);
}

}  // namespace

std::string_view encoding_name(Encoding encoding) {
  switch (encoding) {
    case Encoding::kDense:
      return "dense";
    case Encoding::kRuns:
      return "runs";
    case Encoding::kXorZstd:
      return "xor_zstd";
  }
  return "unknown";
}

void write_header(const Header& header, std::span<const std::byte> body, std::byte* out) {
  coding::encode_u32(out, kMagic);
  out[4] = static_cast<std::byte>(kVersion);
  out[5] = static_cast<std::byte>(header.encoding);
  out[6] = std::byte{0};
  out[7] = std::byte{0};
  coding::encode_u64(out + 8, header.segment_bytes);
  coding::encode_u64(out + 16, header.body_bytes);
  coding::encode_u64(out + 24, header.count);
  coding::encode_u64(out + kChecksumOffset, checksum({out, kChecksumOffset}, body));
}

Result<Header> read_header(std::span<const std::byte> encoded, std::uint64_t segment_bytes,
                           std::string_view what) {
  auto bad = [&](const std::string& why) {
    return corruption("delta for " + std::string(what) + ": " + why);
  };
  if (encoded.size() < kHeaderBytes) {
    return bad("truncated header (" + std::to_string(encoded.size()) + " of " +
               std::to_string(kHeaderBytes) + " bytes)");
  }
  coding::Reader r(encoded.first(kHeaderBytes));
  const std::uint32_t magic = r.u32();
  const std::uint8_t version = r.u8();
  const std::uint8_t encoding = r.u8();
  const std::uint16_t reserved = r.u16();
  Header h;
  h.segment_bytes = r.u64();
  h.body_bytes = r.u64();
  h.count = r.u64();
  const std::uint64_t sum = r.u64();
  if (magic != kMagic) return bad("bad magic (not a ferry delta)");
  if (version != kVersion) return bad("unsupported version " + std::to_string(version));
  if (encoding > static_cast<std::uint8_t>(Encoding::kXorZstd)) {
    return bad("unknown encoding " + std::to_string(encoding));
  }
  h.encoding = static_cast<Encoding>(encoding);
  if (reserved != 0) return bad("reserved header bytes are not zero");
  if (h.segment_bytes != segment_bytes) {
    return bad("segment size " + std::to_string(h.segment_bytes) + " but the destination holds " +
               std::to_string(segment_bytes) + " bytes");
  }
  if (h.body_bytes != encoded.size() - kHeaderBytes) {
    return bad("body size " + std::to_string(h.body_bytes) + " but " +
               std::to_string(encoded.size() - kHeaderBytes) + " bytes follow the header");
  }
  if (h.encoding != Encoding::kRuns && h.count != 0)
    return bad("run count set for a non-runs encoding");
  if (checksum(encoded.first(kChecksumOffset), encoded.subspan(kHeaderBytes)) != sum) {
    return bad("checksum mismatch");
  }
  return h;
}

}  // namespace ferry::delta
