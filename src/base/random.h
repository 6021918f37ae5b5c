// The one source of randomness for session ids, nonces, tokens and unique names: the
// kernel's CSPRNG through getrandom(2). It never falls back to a weaker source (time, pid,
// std::random_device, whose quality is implementation-defined): a failure is an error.
#pragma once

#include <cstdint>
#include <span>

#include "ferry/status.h"

namespace ferry {

// Fills `out` entirely. Blocks only until the kernel's pool is first seeded (early boot).
// Fails (kInternal, naming getrandom and errno) only if the kernel cannot supply randomness.
Status random_bytes(std::span<std::uint8_t> out);

// A random 64-bit value. Aborts the process with a message on stderr if the kernel cannot
// supply randomness, so that no id or nonce is ever predictable; use random_bytes to handle
// that case instead.
std::uint64_t random_u64();

}  // namespace ferry
