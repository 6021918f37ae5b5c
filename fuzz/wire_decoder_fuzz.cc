// Feeds arbitrary bytes to the wire decoder, and what it accepts to a Conversation:
// neither may crash, read out of bounds or allocate without bound; accepted
// messages must re-encode to the same bytes.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>

#include "wire/conversation.h"
#include "wire/message.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  auto m = ferry::wire::decode(bytes, "fuzz");
  if (!m.ok()) return 0;
  if (ferry::wire::encode(*m).size() != size) std::abort();
  ferry::wire::Conversation s(ferry::wire::Conversation::Role::kSender, "fuzz", 7);
  ferry::wire::Conversation r(ferry::wire::Conversation::Role::kReceiver, "fuzz", 0);
  (void)s.received(*m);
  (void)r.received(*m);
  return 0;
}
