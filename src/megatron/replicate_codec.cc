// The replication protocol's coding (replicate.h): encoders and validating decoders.
#include <fmt/format.h>

#include <string>

#include "base/coding.h"
#include "megatron/replicate.h"

namespace ferry::checkpoint {
namespace replicate {
namespace {

std::vector<std::byte> header(Kind kind) {
  std::vector<std::byte> out;
  coding::put_u32(&out, kMagic);
  coding::put_u8(&out, kVersion);
  coding::put_u8(&out, static_cast<std::uint8_t>(kind));
  return out;
}

void put_file(std::vector<std::byte>* out, const ReplicaFile& f) {
  coding::put_u16(out, static_cast<std::uint16_t>(f.path.size()));
  coding::put_bytes(out, f.path);
  coding::put_u64(out, f.bytes);
  coding::put_u64(out, f.xxh3);
}

void read_file_entry(coding::Reader& r, ReplicaFile* f) {
  const std::uint16_t n = r.u16();
  if (n > kMaxPathBytes) {
    (void)r.bytes(r.remaining() + 1);  // fails the reader
    return;
  }
  f->path = r.bytes(n);
  f->bytes = r.u64();
  f->xxh3 = r.u64();
}

// A reader past the header, for a message decode_kind() accepted.
coding::Reader body(std::span<const std::byte> m) {
  coding::Reader r(m);
  (void)r.bytes(kHeaderBytes);
  return r;
}

Status malformed(std::string_view what, const std::string& peer) {
  return corruption(fmt::format("replicate: malformed {} message from {}", what, peer));
}

template <typename T>
Result<T> finish(const coding::Reader& r, T value, std::string_view what, const std::string& peer) {
  if (!r.ok() || r.remaining() != 0) return malformed(what, peer);
  return value;
}

}  // namespace

std::vector<std::byte> encode_list() { return header(Kind::kList); }
std::vector<std::byte> encode_done() { return header(Kind::kDone); }

std::vector<std::byte> encode_index(const ReplicaSet& set) {
  auto out = header(Kind::kIndex);
  coding::put_u8(&out, set.tracker ? 1 : 0);
  coding::put_u64(&out, static_cast<std::uint64_t>(set.tracker.value_or(0)));
  const std::size_t notes = std::min(set.notes.size(), kMaxNotes);
  coding::put_u16(&out, static_cast<std::uint16_t>(notes));
  for (std::size_t i = 0; i < notes; ++i) {
    const std::string_view n = std::string_view(set.notes[i]).substr(0, kMaxNoteBytes);
    coding::put_u32(&out, static_cast<std::uint32_t>(n.size()));
    coding::put_bytes(&out, n);
  }
  coding::put_u32(&out, static_cast<std::uint32_t>(set.files.size()));
  for (const ReplicaFile& f : set.files) put_file(&out, f);
  return out;
}

std::vector<std::byte> encode_get(const ReplicaFile& file) {
  auto out = header(Kind::kGet);
  put_file(&out, file);
  return out;
}

std::vector<std::byte> encode_file(const ReplicaFile& file) {
  auto out = header(Kind::kFile);
  put_file(&out, file);
  return out;
}

std::vector<std::byte> encode_chunk(std::uint64_t offset, std::span<const std::byte> data) {
  auto out = header(Kind::kChunk);
  coding::put_u64(&out, offset);
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

std::vector<std::byte> encode_error(ErrorCode code, std::string_view message) {
  auto out = header(Kind::kError);
  coding::put_u8(&out, static_cast<std::uint8_t>(code));
  const std::string_view m = message.substr(0, kMaxNoteBytes);
  coding::put_u32(&out, static_cast<std::uint32_t>(m.size()));
  coding::put_bytes(&out, m);
  return out;
}

std::size_t max_chunk_bytes(std::size_t message_bytes) {
  return message_bytes > kHeaderBytes + 8 ? message_bytes - kHeaderBytes - 8 : 0;
}

Result<Kind> decode_kind(std::span<const std::byte> m, const std::string& peer) {
  coding::Reader r(m);
  const std::uint32_t magic = r.u32();
  const std::uint8_t version = r.u8();
  const std::uint8_t kind = r.u8();
  if (!r.ok() || magic != kMagic) {
    return corruption(
        fmt::format("replicate: {} sent a message that is not ferry's replicate "
                    "protocol",
                    peer));
  }
  if (version != kVersion) {
    return corruption(
        fmt::format("replicate: {} speaks protocol version {}, we speak {}: use the "
                    "same ferry version on both nodes",
                    peer, version, kVersion));
  }
  if (kind < static_cast<std::uint8_t>(Kind::kList) ||
      kind > static_cast<std::uint8_t>(Kind::kDone)) {
    return corruption(fmt::format("replicate: {} sent unknown message kind {}", peer, kind));
  }
  // LIST and DONE are a header alone; no decoder of their own checks for trailing bytes.
  const auto k = static_cast<Kind>(kind);
  if ((k == Kind::kList || k == Kind::kDone) && r.remaining() != 0) {
    return corruption(fmt::format("replicate: {} sent a {} with {} unexpected bytes after it", peer,
                                  k == Kind::kList ? "LIST" : "DONE", r.remaining()));
  }
  return k;
}

Result<ReplicaSet> decode_index(std::span<const std::byte> m, const std::string& peer) {
  coding::Reader r = body(m);
  ReplicaSet set;
  // One encoding per value: a flag of 0 or 1, no step without the flag, no negative step.
  const std::uint8_t has_tracker = r.u8();
  const std::uint64_t tracker = r.u64();
  if (has_tracker > 1 || (has_tracker == 0 && tracker != 0) ||
      tracker > static_cast<std::uint64_t>(INT64_MAX)) {
    return malformed("INDEX", peer);
  }
  if (has_tracker == 1) set.tracker = static_cast<std::int64_t>(tracker);
  const std::uint16_t notes = r.u16();
  if (notes > kMaxNotes) return malformed("INDEX", peer);
  for (std::uint16_t i = 0; i < notes && r.ok(); ++i) {
    const std::uint32_t n = r.u32();
    if (n > kMaxNoteBytes) return malformed("INDEX", peer);
    set.notes.push_back(r.bytes(n));
  }
  const std::uint32_t files = r.u32();
  // Each entry takes at least 18 bytes: a count beyond what is left is a lie.
  if (!r.ok() || files > r.remaining() / 18) return malformed("INDEX", peer);
  set.files.resize(files);
  for (ReplicaFile& f : set.files) read_file_entry(r, &f);
  return finish(r, std::move(set), "INDEX", peer);
}

Result<ReplicaFile> decode_get(std::span<const std::byte> m, const std::string& peer) {
  coding::Reader r = body(m);
  ReplicaFile f;
  read_file_entry(r, &f);
  return finish(r, std::move(f), "GET", peer);
}

Result<ReplicaFile> decode_file(std::span<const std::byte> m, const std::string& peer) {
  coding::Reader r = body(m);
  ReplicaFile f;
  read_file_entry(r, &f);
  return finish(r, std::move(f), "FILE", peer);
}

Result<Chunk> decode_chunk(std::span<const std::byte> m, const std::string& peer) {
  coding::Reader r = body(m);
  Chunk c;
  c.offset = r.u64();
  if (!r.ok()) return malformed("CHUNK", peer);
  c.data = m.subspan(kHeaderBytes + 8);
  return c;
}

Result<Error> decode_error(std::span<const std::byte> m, const std::string& peer) {
  coding::Reader r = body(m);
  Error e;
  e.code = static_cast<ErrorCode>(r.u8());
  const std::uint32_t n = r.u32();
  if (n > kMaxNoteBytes) return malformed("ERROR", peer);
  e.message = r.bytes(n);
  return finish(r, std::move(e), "ERROR", peer);
}

}  // namespace replicate

}  // namespace ferry::checkpoint
