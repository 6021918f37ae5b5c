// Feeds arbitrary bytes to delta::apply(), both as they come (the header's checksum refuses
// almost all) and behind a header forged with a valid checksum, so the runs and zstd
// validation behind it is reached. apply() may not crash, read or write out of bounds, or
// change the destination when it refuses. A third mode checks the round trip of encode(),
// and that encode_into_hashed() gives the same delta and the XXH3-64 of the current bytes.
#include <xxhash.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>
#include <vector>

#include "delta/delta.h"
#include "delta/format.h"

namespace {

void apply_checked(std::span<const std::byte> encoded, std::size_t segment_bytes) {
  std::vector<std::byte> destination(segment_bytes);
  for (std::size_t i = 0; i < segment_bytes; ++i) destination[i] = static_cast<std::byte>(i * 31);
  const std::vector<std::byte> before = destination;
  const ferry::Status s = ferry::delta::apply(encoded, destination, "fuzz");
  if (!s.ok() && (s.code() != ferry::Code::kCorruption || destination != before)) std::abort();
}

}  // namespace

// Input: mode (1 byte), segment size (2 bytes), then the rest.
extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 3) return 0;
  const std::uint8_t mode = data[0];
  const std::size_t segment_bytes = data[1] | (static_cast<std::size_t>(data[2]) << 8);
  const std::span<const std::byte> rest(reinterpret_cast<const std::byte*>(data + 3), size - 3);
  switch (mode % 3) {
    case 0:  // as received
      apply_checked(rest, segment_bytes);
      break;
    case 1: {  // behind a forged header: encoding and run count from the mode byte
      const auto encoding = static_cast<ferry::delta::Encoding>((mode >> 2) % 3);
      const std::uint64_t count = mode >> 4;
      std::vector<std::byte> forged(ferry::delta::kHeaderBytes);
      forged.insert(forged.end(), rest.begin(), rest.end());
      ferry::delta::write_header({encoding, segment_bytes, rest.size(), count}, rest,
                                 forged.data());
      apply_checked(forged, segment_bytes);
      break;
    }
    case 2: {  // round trip: the two halves of the rest as previous and current
      const std::size_t half = rest.size() / 2;
      const auto previous = rest.first(half), current = rest.subspan(half, half);
      const auto choice = static_cast<ferry::delta::Choice>((mode >> 2) % 4);
      auto encoded = ferry::delta::encode(previous, current, {.choice = choice});
      if (!encoded.ok()) std::abort();
      std::vector<std::byte> destination(previous.begin(), previous.end());
      if (!ferry::delta::apply(*encoded, destination, "fuzz").ok()) std::abort();
      if (!std::equal(destination.begin(), destination.end(), current.begin())) std::abort();
      std::vector<std::byte> hashed;
      std::uint64_t hash = 0;
      if (!ferry::delta::encode_into_hashed(previous, current, {.choice = choice}, &hashed, &hash)
               .ok() ||
          hashed != *encoded || hash != XXH3_64bits(current.data(), current.size())) {
        std::abort();
      }
      break;
    }
  }
  return 0;
}
