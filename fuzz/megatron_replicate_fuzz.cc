// Feeds arbitrary bytes to the checkpoint replication decoders (a puller reads what a
// possibly hostile server sends): none may crash, read out of bounds or allocate without
// bound, and what one accepts must encode back to the same bytes.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>
#include <vector>

#include "megatron/replicate.h"

namespace rp = ferry::checkpoint::replicate;

namespace {

void same_or_abort(const std::vector<std::byte>& encoded, std::span<const std::byte> input) {
  if (encoded.size() != input.size() ||
      !std::equal(encoded.begin(), encoded.end(), input.begin())) {
    std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  auto kind = rp::decode_kind(bytes, "fuzz");
  if (!kind.ok()) return 0;
  switch (*kind) {
    case rp::Kind::kIndex:
      if (auto m = rp::decode_index(bytes, "fuzz"); m.ok())
        same_or_abort(rp::encode_index(*m), bytes);
      break;
    case rp::Kind::kGet:
      if (auto m = rp::decode_get(bytes, "fuzz"); m.ok()) same_or_abort(rp::encode_get(*m), bytes);
      break;
    case rp::Kind::kFile:
      if (auto m = rp::decode_file(bytes, "fuzz"); m.ok())
        same_or_abort(rp::encode_file(*m), bytes);
      break;
    case rp::Kind::kChunk:
      if (auto m = rp::decode_chunk(bytes, "fuzz"); m.ok()) {
        same_or_abort(rp::encode_chunk(m->offset, m->data), bytes);
      }
      break;
    case rp::Kind::kError:
      if (auto m = rp::decode_error(bytes, "fuzz"); m.ok()) {
        same_or_abort(rp::encode_error(m->code, m->message), bytes);
      }
      break;
    case rp::Kind::kList:
      same_or_abort(rp::encode_list(), bytes);
      break;
    case rp::Kind::kDone:
      same_or_abort(rp::encode_done(), bytes);
      break;
  }
  return 0;
}
