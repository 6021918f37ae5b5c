// A receiver's ring mappings are faulted in by a background thread (RingMapping): what a
// reader sees must not depend on how far that thread got, and freeing or replacing a
// mapping while it runs must stop it first.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstddef>
#include <cstring>

#include "support/status_matchers.h"
#include "transport/shm/cow_view.h"
#include "transport/shm/memfd_ring.h"

namespace ferry::shm {
namespace {

constexpr std::uint32_t kSlots = 2;
constexpr std::uint64_t kSlotBytes = std::uint64_t{64} << 20;  // long enough to catch it running

MemfdRing filled_ring() {
  auto ring = MemfdRing::create(kSlots, kSlotBytes);
  EXPECT_OK(ring);
  for (std::uint32_t s = 0; s < kSlots; ++s) {
    std::memset(ring->slot(s), 0x10 + static_cast<int>(s), kSlotBytes);
  }
  return std::move(*ring);
}

MemfdRing reader_of(const MemfdRing& ring) {
  auto mapped = MemfdRing::map_readonly(ScopedFd(::dup(ring.reader_fd())), kSlots, kSlotBytes,
                                        "the test's sender");
  EXPECT_OK(mapped);
  return std::move(*mapped);
}

TEST(ShmRingPrefault, ReaderSeesTheRingWhilePrefaultRunsAndAfter) {
  MemfdRing ring = filled_ring();
  MemfdRing reader = reader_of(ring);
  // Read at once, ahead of the thread, at the end of the last slot and in the first.
  EXPECT_EQ(reader.slot(kSlots - 1)[kSlotBytes - 1], std::byte{0x11});
  EXPECT_EQ(reader.slot(0)[0], std::byte{0x10});
  reader.wait_prefaulted();
  std::memset(ring.slot(0) + 4096, 0x7f, 4096);  // the sender refills: the reader sees it
  EXPECT_EQ(reader.slot(0)[4096 + 100], std::byte{0x7f});
}

TEST(ShmRingPrefault, FreeingOrReplacingAMappingStopsItsPrefaultFirst) {
  MemfdRing ring = filled_ring();
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < 20; ++i) {
    MemfdRing reader = reader_of(ring);  // freed at once, its thread most likely running
  }
  MemfdRing reader = reader_of(ring);
  reader = reader_of(ring);  // the replaced mapping's thread is stopped before it is unmapped
  EXPECT_EQ(reader.slot(1)[12345], std::byte{0x11});
  // Stopped, not waited out: 21 whole prefaults of 128 MiB would take far longer on a VM.
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(20));
}

TEST(ShmRingPrefault, AForkedChildFreesAMappingWhoseThreadItDoesNotHave) {
  MemfdRing ring = filled_ring();
  MemfdRing reader = reader_of(ring);  // its thread most likely still running
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // The prefault thread is the parent's: the child must free the mapping without it.
    const bool ok = reader.slot(1)[7] == std::byte{0x11};
    reader = MemfdRing();
    ::_exit(ok ? 0 : 1);
  }
  int status = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  pid_t done = 0;
  while ((done = ::waitpid(child, &status, WNOHANG)) == 0 &&
         std::chrono::steady_clock::now() < deadline) {
    ::usleep(10'000);
  }
  if (done == 0) ::kill(child, SIGKILL);
  ASSERT_EQ(done, child) << "the child hung freeing its mapping";
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

TEST(ShmRingPrefault, CopyOnWriteViewKeepsWritesPrivateAndForgetsThemWhilePrefaultRuns) {
  MemfdRing ring = filled_ring();
  auto view = CowView::map(ring.reader_fd(), kSlots, kSlotBytes);
  ASSERT_OK(view);
  const auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  // Written at once, likely before the thread reached these pages, and at the end.
  std::memset(view->slot(0), 0x55, 3 * page);
  std::memset(view->slot(1) + kSlotBytes - page, 0x66, page);
  EXPECT_EQ(ring.slot(0)[0], std::byte{0x10}) << "a write into the view reached the ring";
  view->wait_prefaulted();
  EXPECT_EQ(view->slot(0)[2 * page], std::byte{0x55}) << "the prefault lost a private write";
  EXPECT_EQ(view->slot(1)[kSlotBytes - 1], std::byte{0x66});
  ASSERT_OK(view->forget_writes(0));
  EXPECT_EQ(view->slot(0)[0], std::byte{0x10});
  EXPECT_EQ(view->pages_dropped(), 3u);
  EXPECT_EQ(view->slot(1)[kSlotBytes - 1], std::byte{0x66}) << "slot 1's write is still in use";
}

}  // namespace
}  // namespace ferry::shm
