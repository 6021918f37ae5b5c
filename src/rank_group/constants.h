// Limits and timings of the rank groups' protocols (docs/protocol.md, "Rank groups").
// A peer that announces more than a limit is not believed: nothing is allocated for it.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>

namespace ferry::rank_group {

// No collective part or result, and no fetch answer, of a checkpoint is near this (16 GiB).
inline constexpr std::uint64_t kMaxPayloadBytes = 16ull << 30;
// The most characters of a node name (one path component).
inline constexpr std::size_t kMaxNodeNameBytes = 128;
// The version a kJoin and a kFetchHello carry; a peer of another version is refused.
inline constexpr std::uint16_t kVersion = 3;
// kFetch's expected size when the caller takes an answer of any size.
inline constexpr std::uint64_t kAnySize = ~std::uint64_t{0};
// A blob chunk's header: kind (1), collective number (8), total size (8).
inline constexpr std::size_t kBlobHeaderBytes = 1 + 8 + 8;
// How long rank 0 tries to tell a member that the group failed (kAbort).
inline constexpr std::chrono::milliseconds kAbortSendTimeout{1000};

// ---- joining ----

// Connections to rank 0 waiting to say JOIN at once: far above the ranks of a group, low
// enough that a flood cannot run rank 0 out of file descriptors.
inline constexpr std::size_t kMaxPendingHellos = 256;
// How long rank 0 waits for the rest of a JOIN that began to arrive (shm carries a message
// in datagrams): a peer that stops halfway is dropped after this, not at the join's end.
inline constexpr std::chrono::milliseconds kHelloWait{1000};
// The most refused joiners a join error lists.
inline constexpr std::size_t kMaxRefusals = 8;

// ---- waiting ----

// A fetch channel on shm passes its answers through a memfd of kAnswerSlots slots of
// kAnswerSlotBytes, allocated once per channel: fresh shmem pages cost several times the
// copy (docs/benchmarks.md), and a window this size stays in the cache.
inline constexpr std::uint64_t kAnswerSlotBytes = 4ull << 20;
inline constexpr std::uint32_t kAnswerSlots = 2;
// The most fetch channels a rank serves on threads of their own (shm): far above a group's
// fetchers, low enough that a flood of connections cannot spawn threads without end.
inline constexpr std::size_t kMaxServingThreads = 256;
// The longest sleep waiting for news, so a missed wakeup costs little.
inline constexpr std::chrono::milliseconds kIdleWait{50};
// A member waits this much (at most) past the collective timeout, so rank 0's error naming
// a late rank arrives before the member's own timeout.
inline constexpr std::chrono::milliseconds kMemberGrace{5000};

}  // namespace ferry::rank_group
