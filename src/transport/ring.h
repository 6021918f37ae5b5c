// The session's memory: K slots of one bucket each, which a sender fills and its peers read.
// Every transport's ring is a memfd today: shm peers map it, net peers have segments sent
// from and into it once it is registered (Channel::register_memory). A transport whose ring
// lives elsewhere (device memory) turns this into an interface (issue 33).
#pragma once

#include "transport/shm/memfd_ring.h"

namespace ferry::transport {

using Ring = shm::MemfdRing;

}  // namespace ferry::transport
