#include "wire/message.h"

#include <fmt/format.h>

#include "base/coding.h"
#include "base/status_macros.h"

namespace ferry::wire {

std::string_view message_name(MessageType type) {
  switch (type) {
    case MessageType::kHello:
      return "HELLO";
    case MessageType::kWelcome:
      return "WELCOME";
    case MessageType::kBegin:
      return "BEGIN";
    case MessageType::kFilled:
      return "FILLED";
    case MessageType::kRelease:
      return "RELEASE";
    case MessageType::kEnd:
      return "END";
    case MessageType::kAck:
      return "ACK";
    case MessageType::kError:
      return "ERROR";
  }
  return "UNKNOWN";
}

std::string Message::describe() const {
  return fmt::format("{} (session {:016x}, round {})", message_name(type()), session, round);
}

namespace {

using coding::put_bytes;
using coding::put_u16;
using coding::put_u32;
using coding::put_u64;
using coding::put_u8;
using coding::Reader;

void encode_dtype_shape(std::vector<std::byte>* out, const TensorSpec& spec) {
  put_u8(out, static_cast<std::uint8_t>(spec.dtype));
  put_u8(out, static_cast<std::uint8_t>(spec.shape.size()));
  for (std::int64_t d : spec.shape) put_u64(out, static_cast<std::uint64_t>(d));
}

void encode_spec(std::vector<std::byte>* out, const TensorSpec& spec) {
  put_u16(out, static_cast<std::uint16_t>(spec.name.size()));
  put_bytes(out, spec.name);
  encode_dtype_shape(out, spec);
}

struct BodyEncoder {
  std::vector<std::byte>* out;
  void operator()(const Hello& m) const {
    put_u32(out, m.receiver_id);
    put_u32(out, m.pid);
  }
  void operator()(const Welcome& m) const {
    put_u32(out, m.slots);
    put_u64(out, m.slot_bytes);
    put_u8(out, m.checksums);
  }
  void operator()(const Begin& m) const {
    put_u64(out, m.bucket_bytes);
    put_u64(out, m.total_bytes);
    put_u32(out, m.bucket_count);
    put_u8(out, m.more_follows);
    put_u32(out, static_cast<std::uint32_t>(m.manifest.size()));
    for (const TensorSpec& s : m.manifest) encode_spec(out, s);
    put_u8(out, m.keep_copies);
    put_u8(out, m.codec);
    put_u64(out, m.base_version);
    put_u64(out, m.version);
    put_u8(out, m.step.has_value() ? 1 : 0);
    put_u64(out, m.step.value_or(0));
    for (const CodecTarget& t : m.targets) {  // the name is the manifest entry's
      encode_dtype_shape(out, t.spec);
      put_u64(out, t.hash);
    }
  }
  void operator()(const Filled& m) const {
    put_u32(out, m.slot);
    put_u32(out, m.bucket);
    put_u64(out, m.used_bytes);
    put_u64(out, m.checksum);
    put_u64(out, m.offset);
    out->push_back(static_cast<std::byte>(m.last));
  }
  void operator()(const Release& m) const {
    put_u32(out, m.slot);
    put_u32(out, m.bucket);
  }
  void operator()(const RoundTotals& m) const {  // END and ACK
    put_u32(out, m.bucket_count);
    put_u64(out, m.round_checksum);
  }
  void operator()(const Error& m) const {
    put_u8(out, static_cast<std::uint8_t>(m.code));
    const std::string_view text(m.message.data(), std::min(m.message.size(), kMaxErrorBytes));
    put_u32(out, static_cast<std::uint32_t>(text.size()));
    put_bytes(out, text);
  }
};

// Smallest body of each type, and whether it is fixed-size (checked exactly).
struct BodyLimits {
  std::size_t min;
  bool fixed;
};
BodyLimits limits(MessageType t) {
  switch (t) {
    case MessageType::kHello:
      return {8, true};
    case MessageType::kWelcome:
      return {13, true};
    case MessageType::kBegin:
      return {52, false};
    case MessageType::kFilled:
      return {33, true};
    case MessageType::kRelease:
      return {8, true};
    case MessageType::kEnd:
      return {12, true};
    case MessageType::kAck:
      return {12, true};
    case MessageType::kError:
      return {5, false};
  }
  return {0, false};
}

// Reads dtype, rank and dims, and makes the spec of `name`.
Result<TensorSpec> decode_dtype_shape(Reader* r, std::string name, const std::string& where) {
  const std::uint8_t dtype = r->u8();
  const std::uint8_t rank = r->u8();
  if (!r->ok()) return corruption(fmt::format("{}: truncated in tensor '{}'", where, name));
  if (dtype >= kDTypeCount) {
    return corruption(fmt::format("{}: tensor '{}' has dtype value {} (known: 0..{})", where, name,
                                  dtype, kDTypeCount - 1));
  }
  if (rank > kMaxRank) {
    return corruption(
        fmt::format("{}: tensor '{}' has rank {} (at most {})", where, name, rank, kMaxRank));
  }
  std::vector<std::int64_t> shape(rank);
  for (auto& d : shape) {
    const std::uint64_t v = r->u64();
    if (v > static_cast<std::uint64_t>(INT64_MAX)) {
      return corruption(fmt::format("{}: tensor '{}' has a negative dimension", where, name));
    }
    d = static_cast<std::int64_t>(v);
  }
  if (!r->ok()) return corruption(fmt::format("{}: truncated in tensor '{}'", where, name));
  auto spec = TensorSpec::make(std::move(name), static_cast<DType>(dtype), std::move(shape));
  if (!spec.ok()) return corruption(where + ": " + spec.status().message());
  return spec;
}

Result<TensorSpec> decode_spec(Reader* r, std::uint32_t index, const std::string& where) {
  const std::uint16_t name_len = r->u16();
  if (r->ok() && (name_len == 0 || name_len > kMaxNameBytes)) {
    return corruption(fmt::format("{}: tensor {} has a name of {} bytes (allowed 1..{})", where,
                                  index, name_len, kMaxNameBytes));
  }
  std::string name = r->bytes(name_len);
  if (!r->ok()) return corruption(fmt::format("{}: truncated in tensor {}", where, index));
  return decode_dtype_shape(r, std::move(name), where);
}

// The codec fields after BEGIN's manifest (version 4), with the caller's step between the
// versions and the targets (version 5). Any codec id decodes; the receiver refuses one it
// does not know.
Status decode_codec_fields(Reader* r, Begin* b, const std::string& what) {
  b->keep_copies = r->u8();
  b->codec = r->u8();
  b->base_version = r->u64();
  b->version = r->u64();
  const std::uint8_t has_step = r->u8();
  const std::uint64_t step = r->u64();
  if (!r->ok()) return corruption(what + ": truncated in the codec fields");
  if (b->keep_copies > 1) {
    return corruption(fmt::format("{}: keep_copies {} must be 0 or 1", what, b->keep_copies));
  }
  // Strict, so that every accepted BEGIN encodes back to the bytes it came as.
  if (has_step > 1 || (has_step == 0 && step != 0)) {
    return corruption(
        fmt::format("{}: step flag {} with step {} (the flag is 0 or 1; without a "
                    "step the value is 0)",
                    what, has_step, step));
  }
  if (has_step == 1) b->step = step;
  if (b->codec == kDense) {
    if (b->base_version != 0) {
      return corruption(
          fmt::format("{}: a dense round names base version {}", what, b->base_version));
    }
    return ok_status();
  }
  if (b->base_version != 0 && b->base_version >= b->version) {
    return corruption(fmt::format("{}: decoding from version {} to version {} goes backwards", what,
                                  b->base_version, b->version));
  }
  // Each target takes at least 10 bytes (dtype, rank, hash).
  if (b->manifest.size() > r->remaining() / 10) {
    return corruption(fmt::format("{}: {} codec targets cannot fit in {} bytes", what,
                                  b->manifest.size(), r->remaining()));
  }
  b->targets.reserve(b->manifest.size());
  for (const TensorSpec& blob : b->manifest) {
    if (blob.dtype != DType::kU8 || blob.shape.size() != 1) {
      return corruption(fmt::format("{}: payload '{}' is {}, not a U8 vector", what, blob.name,
                                    blob.to_string()));
    }
    FERRY_ASSIGN_OR_RETURN(TensorSpec spec, decode_dtype_shape(r, blob.name, what));
    const std::uint64_t hash = r->u64();
    b->targets.push_back(CodecTarget{std::move(spec), hash});
  }
  return ok_status();
}

RoundTotals read_round_totals(Reader* r) {
  RoundTotals t;
  t.bucket_count = r->u32();
  t.round_checksum = r->u64();
  return t;
}

}  // namespace

std::vector<std::byte> encode(const Message& message) {
  std::vector<std::byte> out;
  out.reserve(64);
  put_u32(&out, kMagic);
  put_u16(&out, kVersion);
  put_u8(&out, static_cast<std::uint8_t>(message.type()));
  put_u8(&out, 0);   // flags: none defined in version 1
  put_u32(&out, 0);  // body length, patched below
  put_u64(&out, message.session);
  put_u64(&out, message.round);
  std::visit(BodyEncoder{&out}, message.body);
  const std::uint32_t body = static_cast<std::uint32_t>(out.size() - kHeaderBytes);
  for (int i = 0; i < 4; ++i) out[8 + i] = static_cast<std::byte>(body >> (8 * i));
  return out;
}

Result<Message> decode(std::span<const std::byte> bytes, std::string_view peer) {
  const std::string from = fmt::format("message from {}", peer);
  if (bytes.size() < kHeaderBytes) {
    return corruption(fmt::format("{}: truncated: {} bytes, a header needs {}", from, bytes.size(),
                                  kHeaderBytes));
  }
  Reader h(bytes.first(kHeaderBytes));
  const std::uint32_t magic = h.u32();
  const std::uint16_t version = h.u16();
  const std::uint8_t type_value = h.u8();
  const std::uint8_t flags = h.u8();
  const std::uint32_t body_len = h.u32();
  Message m;
  m.session = h.u64();
  m.round = h.u64();
  if (magic != kMagic) {
    return corruption(fmt::format("{}: bad magic {:08x} (not a ferry peer?)", from, magic));
  }
  if (version != kVersion) {
    return corruption(
        fmt::format("{}: protocol version {}, this build speaks {}", from, version, kVersion));
  }
  if (type_value < 1 || type_value > 8) {
    return corruption(fmt::format("{}: unknown message type {}", from, type_value));
  }
  const auto type = static_cast<MessageType>(type_value);
  const std::string what = fmt::format("{} {}", message_name(type), from);
  if (flags != 0) return corruption(fmt::format("{}: unknown flags {:#x}", what, flags));
  if (body_len > kMaxBodyBytes) {
    return corruption(
        fmt::format("{}: body of {} bytes exceeds the limit of {}", what, body_len, kMaxBodyBytes));
  }
  if (bytes.size() - kHeaderBytes != body_len) {
    return corruption(fmt::format("{}: header says {} body bytes, {} arrived", what, body_len,
                                  bytes.size() - kHeaderBytes));
  }
  const BodyLimits lim = limits(type);
  if (body_len < lim.min || (lim.fixed && body_len != lim.min)) {
    return corruption(fmt::format("{}: body of {} bytes, expected {}{}", what, body_len,
                                  lim.fixed ? "" : "at least ", lim.min));
  }
  Reader r(bytes.subspan(kHeaderBytes));
  switch (type) {
    case MessageType::kHello: {
      Hello b;
      b.receiver_id = r.u32();
      b.pid = r.u32();
      m.body = b;
      break;
    }
    case MessageType::kWelcome: {
      Welcome b;
      b.slots = r.u32();
      b.slot_bytes = r.u64();
      b.checksums = r.u8();
      if (b.slots == 0 || b.slot_bytes == 0 || b.checksums > 1) {
        return corruption(fmt::format("{}: slots {}, slot bytes {}, checksums {} are not valid",
                                      what, b.slots, b.slot_bytes, b.checksums));
      }
      m.body = b;
      break;
    }
    case MessageType::kBegin: {
      Begin b;
      b.bucket_bytes = r.u64();
      b.total_bytes = r.u64();
      b.bucket_count = r.u32();
      b.more_follows = r.u8();
      if (b.more_follows > 1) {
        return corruption(fmt::format("{}: more_follows is {}, not 0 or 1", what, b.more_follows));
      }
      const std::uint32_t count = r.u32();
      // Each spec takes at least 5 bytes, so a count beyond that is a lie: reject it
      // before reserving memory for it.
      if (count > r.remaining() / 5) {
        return corruption(
            fmt::format("{}: manifest claims {} tensors in {} bytes", what, count, r.remaining()));
      }
      b.manifest.reserve(count);
      std::uint64_t total = 0;
      for (std::uint32_t i = 0; i < count; ++i) {
        auto spec = decode_spec(&r, i, what);
        if (!spec.ok()) return spec.status();
        if (__builtin_add_overflow(total, spec->bytes(), &total)) {
          return corruption(fmt::format("{}: manifest size overflows 64 bits", what));
        }
        b.manifest.push_back(std::move(*spec));
      }
      if (total != b.total_bytes) {
        return corruption(fmt::format("{}: manifest holds {} bytes but total_bytes says {}", what,
                                      total, b.total_bytes));
      }
      if (b.bucket_bytes == 0) return corruption(what + ": bucket_bytes is 0");
      FERRY_RETURN_IF_ERROR(decode_codec_fields(&r, &b, what));
      m.body = std::move(b);
      break;
    }
    case MessageType::kFilled: {
      Filled b;
      b.slot = r.u32();
      b.bucket = r.u32();
      b.used_bytes = r.u64();
      b.checksum = r.u64();
      b.offset = r.u64();
      b.last = r.u8();
      if (b.last > 1)
        return corruption(fmt::format("{}: last flag is {}, not 0 or 1", what, b.last));
      if (b.offset > b.used_bytes) {
        return corruption(fmt::format("{}: segment starts at {}, after its end {}", what, b.offset,
                                      b.used_bytes));
      }
      m.body = b;
      break;
    }
    case MessageType::kRelease: {
      Release b;
      b.slot = r.u32();
      b.bucket = r.u32();
      m.body = b;
      break;
    }
    case MessageType::kEnd:
      m.body = End{read_round_totals(&r)};
      break;
    case MessageType::kAck:
      m.body = Ack{read_round_totals(&r)};
      break;
    case MessageType::kError: {
      Error b;
      const std::uint8_t code = r.u8();
      const std::uint32_t len = r.u32();
      if (code == 0 || code > static_cast<std::uint8_t>(Code::kInternal)) {
        return corruption(fmt::format("{}: unknown status code {}", what, code));
      }
      if (len > kMaxErrorBytes || len != r.remaining()) {
        return corruption(
            fmt::format("{}: text of {} bytes in a body with {} left", what, len, r.remaining()));
      }
      b.code = static_cast<Code>(code);
      b.message = r.bytes(len);
      m.body = std::move(b);
      break;
    }
  }
  if (!r.ok()) return corruption(what + ": truncated body");
  if (r.remaining() != 0) {
    return corruption(fmt::format("{}: {} unexpected bytes after the body", what, r.remaining()));
  }
  return m;
}

}  // namespace ferry::wire
