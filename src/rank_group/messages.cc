#include "rank_group/messages.h"

#include "base/coding.h"
#include "rank_group/constants.h"

namespace ferry::rank_group::msg {
namespace {

std::vector<std::byte> message(Kind kind) {
  std::vector<std::byte> m;
  coding::put_u8(&m, static_cast<std::uint8_t>(kind));
  return m;
}
void put_str(std::vector<std::byte>* out, std::string_view s) {
  coding::put_u32(out, static_cast<std::uint32_t>(s.size()));
  coding::put_bytes(out, s);
}
std::string get_str(coding::Reader& in) { return in.bytes(in.u32()); }

// A reader past the kind byte, which must be `kind`; the reader fails otherwise.
coding::Reader open(std::span<const std::byte> m, Kind kind) {
  coding::Reader in(m);
  if (in.u8() != static_cast<std::uint8_t>(kind)) (void)in.bytes(in.remaining() + 1);
  return in;
}

Status malformed(std::string_view what, const coding::Reader& in) {
  return corruption("malformed " + std::string(what) +
                    (in.ok() ? " (" + std::to_string(in.remaining()) + " bytes too many)"
                             : " (wrong kind or truncated)"));
}

// A Status code read from the wire; false for one this build does not know.
bool code_from_wire(std::uint8_t c, Code* code) {
  if (c > static_cast<std::uint8_t>(Code::kInternal)) return false;
  *code = static_cast<Code>(c);
  return true;
}

}  // namespace

std::uint8_t kind_of(std::span<const std::byte> m) {
  return m.empty() ? 0 : static_cast<std::uint8_t>(m[0]);
}

std::vector<std::byte> encode_join(const Join& join) {
  std::vector<std::byte> m = message(Kind::kJoin);
  coding::put_u16(&m, join.version);
  coding::put_u32(&m, join.rank);
  coding::put_u32(&m, join.size);
  put_str(&m, join.node);
  put_str(&m, join.address);
  return m;
}

Result<Join> decode_join(std::span<const std::byte> m) {
  coding::Reader in = open(m, Kind::kJoin);
  Join j;
  j.version = in.u16();
  j.rank = in.u32();
  j.size = in.u32();
  j.node = get_str(in);
  j.address = get_str(in);
  if (!in.ok() || in.remaining() != 0) return malformed("join message", in);
  return j;
}

std::vector<std::byte> encode_table(const Table& table) {
  std::vector<std::byte> m = message(Kind::kTable);
  coding::put_u32(&m, static_cast<std::uint32_t>(table.nodes.size()));
  for (std::size_t r = 0; r < table.nodes.size(); ++r) {
    put_str(&m, table.nodes[r]);
    put_str(&m, table.addresses[r]);
  }
  return m;
}

Result<Table> decode_table(std::span<const std::byte> m, std::uint32_t size) {
  coding::Reader in = open(m, Kind::kTable);
  const std::uint32_t n = in.u32();
  if (in.ok() && n != size) {
    return corruption("malformed member table: " + std::to_string(n) + " ranks, expected " +
                      std::to_string(size));
  }
  Table t;
  for (std::uint32_t r = 0; r < n && in.ok(); ++r) {
    t.nodes.push_back(get_str(in));
    t.addresses.push_back(get_str(in));
  }
  if (!in.ok() || in.remaining() != 0) return malformed("member table", in);
  return t;
}

std::vector<std::byte> encode_blob_chunk(Kind kind, std::uint64_t seq, std::uint64_t total,
                                         std::string_view bytes) {
  std::vector<std::byte> m = message(kind);
  coding::put_u64(&m, seq);
  coding::put_u64(&m, total);
  coding::put_bytes(&m, bytes);
  return m;
}

Result<BlobChunk> decode_blob_chunk(std::span<const std::byte> m, Kind kind) {
  coding::Reader in = open(m, kind);
  BlobChunk c;
  c.kind = kind;
  c.seq = in.u64();
  c.total = in.u64();
  if (!in.ok()) return malformed("collective message", in);
  c.bytes = m.subspan(kBlobHeaderBytes);
  return c;
}

Status Blob::feed(std::span<const std::byte> m, Kind kind, std::uint64_t seq,
                  const std::string& who) {
  auto chunk = decode_blob_chunk(m, kind);
  if (!chunk.ok()) return chunk.status().with_context(who);
  if (chunk->seq != seq) {
    return corruption(who + " is at collective #" + std::to_string(chunk->seq) +
                      " while this rank is at #" + std::to_string(seq) +
                      " (every rank must call the collectives in the same order)");
  }
  if (started && chunk->total != total) {
    return corruption("inconsistent collective message from " + who + ": a total of " +
                      std::to_string(chunk->total) + " bytes, earlier " + std::to_string(total));
  }
  if (!started) {
    if (chunk->total > kMaxPayloadBytes) {
      return corruption(who + " announced a collective part of " + std::to_string(chunk->total) +
                        " bytes (at most " + std::to_string(kMaxPayloadBytes) + ")");
    }
    started = true;  // nothing is reserved for the total: it grows as its bytes come
    total = chunk->total;
  }
  if (chunk->bytes.size() > total - data.size()) {
    return corruption("oversized collective message from " + who + ": " +
                      std::to_string(chunk->bytes.size()) + " bytes past the " +
                      std::to_string(data.size()) + " of " + std::to_string(total) + " received");
  }
  data.append(reinterpret_cast<const char*>(chunk->bytes.data()), chunk->bytes.size());
  return ok_status();
}

std::string encode_parts(const std::vector<std::string>& parts) {
  std::vector<std::byte> out;
  coding::put_u32(&out, static_cast<std::uint32_t>(parts.size()));
  for (const std::string& p : parts) {
    coding::put_u64(&out, p.size());
    coding::put_bytes(&out, p);
  }
  return {reinterpret_cast<const char*>(out.data()), out.size()};
}

Result<std::vector<std::string>> decode_parts(std::string_view blob, std::uint32_t size) {
  coding::Reader in(std::as_bytes(std::span(blob)));
  const std::uint32_t n = in.u32();
  if (in.ok() && n != size) {
    return corruption("malformed collective result: " + std::to_string(n) + " parts, expected " +
                      std::to_string(size));
  }
  std::vector<std::string> parts;
  for (std::uint32_t r = 0; r < n && in.ok(); ++r) parts.push_back(in.bytes(in.u64()));
  if (!in.ok() || in.remaining() != 0) return malformed("collective result", in);
  return parts;
}

std::vector<std::byte> encode_abort(const Status& why) {
  std::vector<std::byte> m = message(Kind::kAbort);
  coding::put_u8(&m, static_cast<std::uint8_t>(why.code()));
  put_str(&m, why.message());
  return m;
}

Result<Abort> decode_abort(std::span<const std::byte> m) {
  coding::Reader in = open(m, Kind::kAbort);
  const std::uint8_t wire_code = in.u8();
  std::string message = get_str(in);
  Code code = Code::kOk;
  if (!in.ok() || in.remaining() != 0) return malformed("abort message", in);
  if (!code_from_wire(wire_code, &code) || code == Code::kOk) {
    return corruption("malformed abort message: status code " + std::to_string(wire_code));
  }
  return Abort{code, std::move(message)};
}

std::vector<std::byte> encode_fetch_hello(const FetchHello& hello) {
  std::vector<std::byte> m = message(Kind::kFetchHello);
  coding::put_u16(&m, hello.version);
  coding::put_u32(&m, hello.rank);
  return m;
}

Result<FetchHello> decode_fetch_hello(std::span<const std::byte> m) {
  coding::Reader in = open(m, Kind::kFetchHello);
  FetchHello h;
  h.version = in.u16();
  h.rank = in.u32();
  if (!in.ok() || in.remaining() != 0) return malformed("fetch hello", in);
  return h;
}

std::vector<std::byte> encode_fetch(const Fetch& fetch) {
  std::vector<std::byte> m = message(Kind::kFetch);
  coding::put_u32(&m, fetch.id);
  coding::put_u64(&m, fetch.expected);
  coding::put_bytes(&m, fetch.request);
  return m;
}

Result<Fetch> decode_fetch(std::span<const std::byte> m) {
  coding::Reader in = open(m, Kind::kFetch);
  Fetch f;
  f.id = in.u32();
  f.expected = in.u64();
  f.request = in.bytes(in.remaining());
  if (!in.ok()) return malformed("fetch request", in);
  return f;
}

std::vector<std::byte> encode_answer(const Answer& answer) {
  std::vector<std::byte> m = message(Kind::kAnswer);
  coding::put_u32(&m, answer.id);
  coding::put_u8(&m, static_cast<std::uint8_t>(answer.code));
  coding::put_u64(&m, answer.size);
  coding::put_bytes(&m, answer.error);
  return m;
}

Result<Answer> decode_answer(std::span<const std::byte> m) {
  coding::Reader in = open(m, Kind::kAnswer);
  Answer a;
  a.id = in.u32();
  const std::uint8_t wire_code = in.u8();
  a.size = in.u64();
  a.error = in.bytes(in.remaining());
  if (!in.ok()) return malformed("fetch answer", in);
  if (!code_from_wire(wire_code, &a.code)) {
    return corruption("malformed fetch answer: status code " + std::to_string(wire_code));
  }
  return a;
}

std::vector<std::byte> encode_piece(Kind kind, const Piece& piece) {
  std::vector<std::byte> m = message(kind);
  coding::put_u32(&m, piece.id);
  coding::put_u32(&m, piece.index);
  return m;
}

Result<Piece> decode_piece(std::span<const std::byte> m, Kind kind) {
  coding::Reader in = open(m, kind);
  Piece p;
  p.id = in.u32();
  p.index = in.u32();
  if (!in.ok() || in.remaining() != 0) {
    return malformed(kind == Kind::kPiece ? "answer piece" : "answer piece taken", in);
  }
  return p;
}

}  // namespace ferry::rank_group::msg
