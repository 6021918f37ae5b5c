// Feeds arbitrary bytes to the net handshake decoders (auth.h), which a listener runs on
// whatever an unauthenticated TCP client sends: they must never crash, and what one
// accepts must encode back to the same bytes.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>
#include <vector>

#include "transport/net/auth.h"

namespace hs = ferry::net::handshake;

namespace {

template <typename Decoded>
void check(std::span<const std::byte> in, const Decoded& decoded) {
  if (!decoded.ok()) return;
  const std::vector<std::byte> again = hs::encode(*decoded);
  if (again.size() != in.size() || !std::equal(again.begin(), again.end(), in.begin())) {
    std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::span<const std::byte> in(reinterpret_cast<const std::byte*>(data), size);
  check(in, hs::decode_hello(in, "peer"));
  check(in, hs::decode_challenge(in, "peer"));
  check(in, hs::decode_proof(in, "peer"));
  check(in, hs::decode_verdict(in, "peer"));
  check(in, hs::decode_confirm(in, "peer"));
  // ADDRESS is sealed: its parser and verification have their own target
  // (transport_address_frame_fuzz.cc); here only that splitting arbitrary bytes is safe.
  (void)hs::split_address(in, "peer");
  return 0;
}
