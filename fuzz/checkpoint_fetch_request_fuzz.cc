// Feeds arbitrary bytes to the fetch request decoder (a serving rank reads what its
// peers send during a load): it must never crash or throw, and what it accepts must
// encode to a request that decodes to the same thing.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "checkpoint/fetch_request.h"

namespace ck = ferry::checkpoint;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto r = ck::decode_fetch_request(text, "rank 0");
  if (!r.ok()) return 0;
  auto again = ck::decode_fetch_request(ck::encode_fetch_request(*r), "rank 0");
  if (!again.ok() || !(*again == *r)) std::abort();
  return 0;
}
