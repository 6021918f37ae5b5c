#include "codec/delta_codec.h"
#include "delta/delta.h"

namespace ferry::codec {

Status DeltaReceiveCodec::decode(std::span<const std::byte> payload, std::span<std::byte> onto,
                                 std::string_view what) const {
  return delta::apply(payload, onto, what);
}

}  // namespace ferry::codec
