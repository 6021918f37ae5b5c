// Feeds arbitrary text to the checkpoint manifest decoder (manifest.json is read from disk
// and from peers): it may reject, never crash; what it accepts encodes to a manifest it
// accepts again, unchanged.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "checkpoint/format.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto m = ferry::checkpoint::format::decode_manifest(text, "fuzz");
  if (!m.ok()) return 0;
  const std::string again = ferry::checkpoint::format::encode_manifest(*m);
  auto m2 = ferry::checkpoint::format::decode_manifest(again, "fuzz");
  if (!m2.ok() || ferry::checkpoint::format::encode_manifest(*m2) != again) std::abort();
  return 0;
}
