// Helpers shared by the folder conversions (internal to the convert module).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "ferry/convert.h"
#include "ferry/safetensors.h"

namespace ferry::convert {

std::string megatron_layout_json(const MegatronLayout& layout, DType dtype);

// Gathers small pieces (a row-parallel split gives one per row) into large writes.
class StagedWriter {
 public:
  explicit StagedWriter(SafetensorsWriter* writer, std::size_t capacity = 8 << 20)
      : writer_(writer), capacity_(capacity) {}
  Status add(std::span<const std::byte> data);
  Status zeros(std::uint64_t bytes);
  Status flush();

 private:
  SafetensorsWriter* writer_;
  std::size_t capacity_;
  std::vector<std::byte> buffer_;
};

}  // namespace ferry::convert
