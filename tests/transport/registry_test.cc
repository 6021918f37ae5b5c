// transport::Registry: the address's scheme picks the transport, an unknown scheme is an
// error naming the address, each transport is made once, and every transport allocates a
// ring its end can write (shm: one a peer maps).
#include "transport/registry.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <string>
#include <vector>

#include "support/status_matchers.h"
#include "support/test_support.h"
#include "transport/transport.h"

namespace ferry::transport {
namespace {

TEST(RegistryTest, SchemeFollowsTheAddressForm) {
  EXPECT_EQ(Registry::scheme_of("@ferry-job"), "shm");
  EXPECT_EQ(Registry::scheme_of("ferry-job"), "shm");
  EXPECT_EQ(Registry::scheme_of("/tmp/ferry.sock"), "shm");
  EXPECT_EQ(Registry::scheme_of("./a:b"), "shm") << "a path with a colon is still a path";
  EXPECT_EQ(Registry::scheme_of("@a:1"), "shm") << "an abstract name with a colon";
  EXPECT_EQ(Registry::scheme_of("127.0.0.1:5555"), "net");
  EXPECT_EQ(Registry::scheme_of("trainer:0"), "net");
  EXPECT_EQ(Registry::scheme_of("rdma://10.0.0.1:4791"), "rdma");
  EXPECT_EQ(Registry::scheme_of("hccl://node1:7000"), "hccl");
}

TEST(RegistryTest, UnknownSchemeIsAnErrorNamingTheAddress) {
  Registry transports({});
  const std::string address = "rdma://10.0.0.1:4791";
  // shm and net are picked by the address's form; written, their scheme is unknown too.
  for (const std::string form : {"shm://@job", "net://10.0.0.1:5555"}) {
    auto t = transports.for_address(form);
    EXPECT_EQ(t.status().code(), Code::kInvalidArgument) << form;
    EXPECT_NE(t.status().message().find(form), std::string::npos) << t.status().message();
  }
  for (const Status& s :
       {transports.for_address(address).status(), transports.listen(address).status(),
        transports.connect(address, std::chrono::milliseconds(10)).status()}) {
    EXPECT_EQ(s.code(), Code::kInvalidArgument) << s.to_string();
    EXPECT_NE(s.message().find("unknown transport scheme 'rdma'"), std::string::npos)
        << s.message();
    EXPECT_NE(s.message().find(address), std::string::npos) << s.message();
  }
}

TEST(RegistryTest, ShmNeedsNoSecretAndSharesMemory) {
  Registry transports({.secret_file = "/nonexistent/ferry-token"});
  auto shm = transports.for_address("@ferry-registry-test");
  ASSERT_OK(shm);
  EXPECT_EQ((*shm)->scheme(), "shm");
  EXPECT_TRUE((*shm)->shares_memory());
  EXPECT_TRUE((*shm)->connect_in_slices());
}

TEST(RegistryTest, NetWithoutItsSecretFailsNamingTheFile) {
  Registry transports({.secret_file = "/nonexistent/ferry-token"});
  auto net = transports.for_address("127.0.0.1:1");
  ASSERT_FALSE(net.ok());
  EXPECT_NE(net.status().message().find("/nonexistent/ferry-token"), std::string::npos)
      << net.status().message();
}

class RegistryWithSecret : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string path = dir_.file("token");
    testing::write_bytes(path, testing::kTestToken);
    ASSERT_EQ(::chmod(path.c_str(), 0600), 0);
    transports_ = std::make_unique<Registry>(TransportConfig{.secret_file = path});
  }
  testing::TempDir dir_;
  std::unique_ptr<Registry> transports_;
};

TEST_F(RegistryWithSecret, EachTransportIsMadeOnceAndShared) {
  auto first = transports_->for_address("10.0.0.1:5555");
  ASSERT_OK(first);
  auto second = transports_->for_address("127.0.0.1:0");
  ASSERT_OK(second);
  EXPECT_EQ(*first, *second) << "one net transport (one UCX context) for every net address";
  EXPECT_EQ((*first)->scheme(), "net");
  EXPECT_FALSE((*first)->shares_memory());
  EXPECT_FALSE((*first)->connect_in_slices());
  auto shm = transports_->for_address("@x");
  ASSERT_OK(shm);
  EXPECT_NE(*shm, *first);
}

// Every transport's ring: the asked shape, every slot writable by its end.
class RingAllocation : public RegistryWithSecret,
                       public ::testing::WithParamInterface<const char*> {};

TEST_P(RingAllocation, RingHasTheAskedShapeAndEverySlotIsWritable) {
  auto transport = transports_->for_address(GetParam());
  ASSERT_OK(transport);
  constexpr std::uint32_t kSlots = 3;
  constexpr std::uint64_t kSlotBytes = 4096 + 16;
  auto allocated = (*transport)->allocate_ring(kSlots, kSlotBytes);
  ASSERT_OK(allocated);
  const Ring& ring = **allocated;
  EXPECT_EQ(ring.slots(), kSlots);
  EXPECT_EQ(ring.slot_bytes(), kSlotBytes);
  EXPECT_EQ(ring.memory().size(), kSlots * kSlotBytes);
  for (std::uint32_t i = 0; i < kSlots; ++i) {
    std::fill_n(ring.slot(i), kSlotBytes, static_cast<std::byte>(i + 1));
  }
  for (std::uint32_t i = 0; i < kSlots; ++i) {
    EXPECT_EQ(ring.slot(i)[kSlotBytes - 1], static_cast<std::byte>(i + 1)) << "slot " << i;
  }
}

// What a receiver hands a caller that writes into its tensors: writes stay in the view, the
// ring keeps its bytes, and forget_writes shows the ring's again.
TEST_P(RingAllocation, WritableViewIsPrivateToItsWriter) {
  auto transport = transports_->for_address(GetParam());
  ASSERT_OK(transport);
  auto ring = (*transport)->allocate_ring(2, 8192);
  ASSERT_OK(ring);
  std::fill_n((*ring)->slot(1), 8192, std::byte{7});
  auto view = (*ring)->writable_view();
  ASSERT_OK(view);
  EXPECT_EQ((*view)->slot(1)[100], std::byte{7});
  (*view)->slot(1)[100] = std::byte{9};
  EXPECT_EQ((*ring)->slot(1)[100], std::byte{7}) << "a write into the view reached the ring";
  ASSERT_OK((*view)->forget_writes(1));
  EXPECT_EQ((*view)->slot(1)[100], std::byte{7});
}

INSTANTIATE_TEST_SUITE_P(Transports, RingAllocation,
                         ::testing::Values("@ferry-ring-test", "127.0.0.1:0"),
                         [](const ::testing::TestParamInfo<const char*>& param) {
                           return Registry::scheme_of(param.param);
                         });

TEST_F(RegistryWithSecret, ShmPeerMapsTheRingItsSenderAllocated) {
  auto shm = transports_->for_address("@ferry-ring-test");
  ASSERT_OK(shm);
  auto ring = (*shm)->allocate_ring(2, 8192);
  ASSERT_OK(ring);
  (*ring)->slot(1)[5] = std::byte{42};
  ASSERT_GE((*ring)->share_fd(), 0);
  auto mapped =
      (*shm)->map_peer_ring(ScopedFd(::dup((*ring)->share_fd())), 2, 8192, "the test's sender");
  ASSERT_OK(mapped);
  EXPECT_EQ((*mapped)->slot(1)[5], std::byte{42});
  // The peer maps it read-only; its writable view is its own.
  auto view = (*mapped)->writable_view();
  ASSERT_OK(view);
  (*view)->slot(1)[5] = std::byte{43};
  EXPECT_EQ((*ring)->slot(1)[5], std::byte{42});
  EXPECT_EQ((*mapped)->slot(1)[5], std::byte{42});
}

TEST_F(RegistryWithSecret, NetMapsNoPeerRing) {
  auto net = transports_->for_address("127.0.0.1:0");
  ASSERT_OK(net);
  auto mapped = (*net)->map_peer_ring(ScopedFd(), 1, 4096, "a peer");
  EXPECT_EQ(mapped.status().code(), Code::kFailedPrecondition) << mapped.status().to_string();
  EXPECT_NE(mapped.status().message().find("a peer"), std::string::npos);
  std::byte into[16];
  Status read = (*net)->read_peer_memory(ScopedFd(), 0, into, "a peer");
  EXPECT_EQ(read.code(), Code::kFailedPrecondition) << read.to_string();
}

// A listener on every interface is reached at the host its peer reached this end by (or
// the peer's own, as this end saw it); a named host stays; shm addresses are as they are.
TEST_F(RegistryWithSecret, ReachableAddressReplacesOnlyEveryInterface) {
  auto net = transports_->for_address("127.0.0.1:0");
  ASSERT_OK(net);
  const auto reach = [&](const std::string& listening, const std::string& via) {
    auto r = (*net)->reachable_address(listening, via);
    return r.ok() ? *r : "error: " + r.status().message();
  };
  EXPECT_EQ(reach("0.0.0.0:7001", "10.1.2.3:5000"), "10.1.2.3:7001");
  EXPECT_EQ(reach("[::]:7001", "[fe80::1]:5000"), "[fe80::1]:7001");
  EXPECT_EQ(reach("10.9.9.9:7001", "10.1.2.3:5000"), "10.9.9.9:7001");
  EXPECT_EQ(reach("node-a:7001", ""), "node-a:7001");
  const std::string no_host = reach("0.0.0.0:7001", "");
  EXPECT_NE(no_host.find("error: cannot tell which host reaches the listener at 0.0.0.0:7001"),
            std::string::npos)
      << no_host;
  EXPECT_NE(reach("0.0.0.0:7001", "0.0.0.0:5000").find("error: "), std::string::npos);
  auto shm = transports_->for_address("@ferry-ring-test");
  ASSERT_OK(shm);
  auto same = (*shm)->reachable_address("@ferry-ckpt-r1", "");
  ASSERT_OK(same);
  EXPECT_EQ(*same, "@ferry-ckpt-r1");
}

// A rank group's fetch answer: read once, without mapping. A peer's descriptor is checked
// first: only a memfd sealed against resizing (no read of it can block or come up short),
// holding at least the bytes its message promised.
TEST_F(RegistryWithSecret, ShmReadsPeerMemoryOnlyFromASealedMemfdLargeEnough) {
  auto shm = transports_->for_address("@ferry-ring-test");
  ASSERT_OK(shm);
  auto ring = (*shm)->allocate_ring(1, 3 * 4096);
  ASSERT_OK(ring);
  for (std::size_t i = 0; i < 3 * 4096; ++i) (*ring)->slot(0)[i] = std::byte(i * 7);
  const ScopedFd passed(::dup((*ring)->share_fd()));
  std::vector<std::byte> into(3 * 4096 - 5);
  ASSERT_OK((*shm)->read_peer_memory(passed, 5, into, "rank 3"));
  EXPECT_TRUE(std::equal(into.begin(), into.end(), (*ring)->slot(0) + 5));
  ASSERT_OK((*shm)->read_peer_memory(passed, 0, std::span(into).first(100), "rank 3"));
  EXPECT_TRUE(std::equal(into.begin(), into.begin() + 100, (*ring)->slot(0)));

  Status short_read = (*shm)->read_peer_memory(passed, 6, into, "rank 3");
  EXPECT_EQ(short_read.code(), Code::kCorruption) << short_read.to_string();
  EXPECT_NE(short_read.message().find("rank 3"), std::string::npos) << short_read.to_string();
  short_read = (*shm)->read_peer_memory(passed, ~std::uint64_t{0}, std::span(into).first(2), "r");
  EXPECT_EQ(short_read.code(), Code::kCorruption) << short_read.to_string();

  ScopedFd unsealed(::memfd_create("unsealed", MFD_CLOEXEC));
  ASSERT_TRUE(unsealed.valid());
  ASSERT_EQ(::ftruncate(unsealed.get(), 4096), 0);
  Status s = (*shm)->read_peer_memory(unsealed, 0, std::span(into).first(16), "rank 3");
  EXPECT_EQ(s.code(), Code::kFailedPrecondition) << s.to_string();

  int pipe_fds[2];
  ASSERT_EQ(::pipe(pipe_fds), 0);  // a read of it would block: refused before any read
  ScopedFd write_end(pipe_fds[1]);
  const ScopedFd read_end(pipe_fds[0]);
  s = (*shm)->read_peer_memory(read_end, 0, std::span(into).first(16), "rank 3");
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("rank 3"), std::string::npos) << s.to_string();
}

}  // namespace
}  // namespace ferry::transport
