#include "base/random.h"

#include <sys/random.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace ferry {

Status random_bytes(std::span<std::uint8_t> out) {
  std::size_t done = 0;
  while (done < out.size()) {
    // One call returns at most 32 MiB, and a signal may cut a call over 256 bytes short.
    const ssize_t n = ::getrandom(out.data() + done, out.size() - done, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      return internal_error("getrandom(" + std::to_string(out.size()) +
                            " bytes): " + std::strerror(n < 0 ? errno : EIO) +
                            ": the kernel supplies no randomness");
    }
    done += static_cast<std::size_t>(n);
  }
  return ok_status();
}

std::uint64_t random_u64() {
  std::uint8_t bytes[8];
  if (const Status s = random_bytes(bytes); !s.ok()) {
    std::fprintf(stderr, "ferry: fatal: %s\n", s.message().c_str());
    std::abort();
  }
  std::uint64_t v = 0;
  for (std::uint8_t b : bytes) v = (v << 8) | b;
  return v;
}

}  // namespace ferry
