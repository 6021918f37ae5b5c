// Feeds arbitrary bytes to the safetensors header validator as a whole file.
// Any header it accepts must describe ranges inside the data section.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>

#include "ferry/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  auto header = ferry::parse_safetensors_header(bytes, size, "fuzz");
  if (header.ok()) {
    for (const ferry::SafetensorsEntry& e : header->tensors) {
      if (e.end > header->data_bytes || e.begin > e.end || e.spec.bytes() != e.end - e.begin) {
        std::abort();
      }
    }
  }
  return 0;
}
