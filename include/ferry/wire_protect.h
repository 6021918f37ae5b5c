// How a net session protects its bulk bytes (the tensors) on the wire; control messages
// are always sealed (AES-256-GCM). docs/security.md ("On the wire") has the threat model.
#pragma once

#include <cstdint>
#include <string_view>

#include "ferry/export.h"
#include "ferry/status.h"

namespace ferry {

// Values travel on the wire (in sealed control frames): never renumber. Ordered by
// strength, so a receiver's minimum is a comparison.
enum class WireProtect : std::uint8_t {
  kNone = 0,     // bulk bytes in clear, unauthenticated (XXH3 still catches accidents)
  kMac = 1,      // bulk bytes in clear, each transfer authenticated (AES-GCM tag, GMAC)
  kEncrypt = 2,  // bulk bytes encrypted and authenticated (AES-256-GCM)
};

// "none", "mac", "encrypt".
FERRY_EXPORT std::string_view wire_protect_name(WireProtect p);
// The inverse; kInvalidArgument naming `text` and the choices otherwise.
FERRY_EXPORT Result<WireProtect> parse_wire_protect(std::string_view text);

}  // namespace ferry
