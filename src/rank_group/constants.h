// Limits and timings of the rank groups' protocols (docs/protocol.md, "Rank groups").
// A peer that announces more than a limit is not believed: nothing is allocated for it.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>

namespace ferry::rank_group {

// ---- both groups ----

// No collective part or result, and no fetch answer, of a checkpoint is near this (16 GiB).
inline constexpr std::uint64_t kMaxPayloadBytes = 16ull << 30;
// The most characters of a node name (one path component).
inline constexpr std::size_t kMaxNodeNameBytes = 128;
// The version a kJoin and a kFetchHello carry; a peer of another version is refused.
inline constexpr std::uint16_t kVersion = 1;
// kFetch's expected size when the caller takes an answer of any size.
inline constexpr std::uint64_t kAnySize = ~std::uint64_t{0};
// A blob chunk's header: kind (1), collective number (8), total size (8).
inline constexpr std::size_t kBlobHeaderBytes = 1 + 8 + 8;
// How long rank 0 tries to tell a member that the group failed (kAbort).
inline constexpr std::chrono::milliseconds kAbortSendTimeout{1000};

// ---- local group (UNIX-domain stream sockets) ----

// A join holds a rank, a size and two short strings; a frame announcing more is not a
// rank's (64 KiB). Every other frame is at most transport::kMaxMessageBytes.
inline constexpr std::uint64_t kMaxHelloBytes = 64 * 1024;
// Connections to rank 0 waiting to say hello at once: far above the ranks of one node,
// low enough that a flood cannot run rank 0 out of file descriptors.
inline constexpr std::size_t kMaxPendingHellos = 256;
// listen() backlog of the root and fetch sockets.
inline constexpr int kListenBacklog = 128;
// A rank connecting before rank 0 listens retries this often.
inline constexpr std::chrono::milliseconds kConnectRetry{20};
// How often the fetch server looks at its stop flag while no one connects.
inline constexpr std::chrono::milliseconds kServePollInterval{50};

// ---- net group (UCX) ----

// The most refused joiners a join error lists.
inline constexpr std::size_t kMaxRefusals = 8;
// The longest sleep waiting for UCX news, so a missed wakeup costs little.
inline constexpr std::chrono::milliseconds kIdleWait{50};
// A member waits this much (at most) past the collective timeout, so rank 0's error naming
// a late rank arrives before the member's own timeout.
inline constexpr std::chrono::milliseconds kMemberGrace{5000};

}  // namespace ferry::rank_group
