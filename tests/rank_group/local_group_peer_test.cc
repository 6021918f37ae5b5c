// The local group's rank 0 against connections that are not ranks: a process of another
// user and a same-user process that connects and says nothing (issue #14, item 13). Both
// are dropped with a warning; the real ranks join and a collective completes. So are a peer
// that stops halfway through its hello and one that sends something else; a rank of
// another group size fails the join on both sides. The group runs on the shm transport: a
// SEQPACKET socket whose datagrams start with a byte saying whether more of the message
// follow (transport/shm/seqpacket_channel.h).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <thread>

#include "base/file_util.h"
#include "ferry/rank_group.h"
#include "rank_group/group_test_util.h"
#include "support/status_matchers.h"
#include "support/test_support.h"

namespace ferry::rank_group::test {
namespace {

using checkpoint::connect_local_group;
using checkpoint::LocalGroupOptions;

using std::chrono::milliseconds;

int connect_abstract(const std::string& address) {
  return ferry::testing::connect_abstract(address, SOCK_SEQPACKET);
}

Status join_and_gather(const std::string& address, int rank) {
  LocalGroupOptions o{address, rank, 2, "n0", milliseconds(10'000)};
  auto g = connect_local_group(o);
  if (!g.ok()) return g.status();
  auto all = (*g)->all_gather("rank" + std::to_string(rank));
  if (!all.ok()) return all.status();
  if (all->size() != 2 || (*all)[0] != "rank0" || (*all)[1] != "rank1") {
    return corruption("all_gather returned the wrong parts");
  }
  return ok_status();
}

TEST(LocalGroupPeers, SilentAndForeignConnectionsDoNotStopRanksFromJoining) {
  const std::string address = unique_address();
  ASSERT_EQ(address[0], '@');
  Status rank0;
  std::thread r0([&] { rank0 = join_and_gather(address, 0); });
  ScopedFd silent(connect_abstract(address));  // same user, never says hello
  ASSERT_TRUE(silent.valid());
  pid_t intruder = -1;
  if (::geteuid() == 0) {
    intruder = ferry::testing::connect_as_another_user(address, SOCK_SEQPACKET);
    EXPECT_GT(intruder, 0) << "could not connect as uid 65534";
  } else {
    std::fprintf(stderr, "not root: the uid-65534 peer is left out of this test\n");
  }
  Status rank1 = join_and_gather(address, 1);
  r0.join();
  EXPECT_OK(rank0);
  EXPECT_OK(rank1);
  if (intruder > 0) {
    ::kill(intruder, SIGKILL);
    ::waitpid(intruder, nullptr, 0);
  }
}

// A same-user process that sends the first bytes of a hello and then stops (issue #14,
// items 12 and 13): rank 0 read hellos one whole frame at a time, so this peer held the
// join, and every real rank with it, until the group's deadline.
TEST(LocalGroupPeers, AHalfSentHelloDoesNotStallOtherRanks) {
  const std::string address = unique_address();
  const auto start = std::chrono::steady_clock::now();
  Status rank0;
  std::thread r0([&] { rank0 = join_and_gather(address, 0); });
  ScopedFd half(connect_abstract(address));
  ASSERT_TRUE(half.valid());
  // The first datagram of a message with more to follow: a join's kind and version, a
  // rank's first byte.
  const unsigned char partial[5] = {1, 1, 2, 0, 1};
  ASSERT_EQ(::send(half.get(), partial, sizeof partial, MSG_NOSIGNAL),
            static_cast<ssize_t>(sizeof partial));
  std::this_thread::sleep_for(milliseconds(200));  // rank 0 has started on it
  Status rank1 = join_and_gather(address, 1);
  r0.join();
  const auto took = std::chrono::steady_clock::now() - start;
  EXPECT_OK(rank0);
  EXPECT_OK(rank1);
  // The group's deadline is 10 s; the join and collective take milliseconds.
  EXPECT_LT(took, std::chrono::seconds(5));
}

// A message that is not a JOIN is dropped at once, not waited on.
TEST(LocalGroupPeers, AMessageThatIsNotAJoinDoesNotStallOtherRanks) {
  const std::string address = unique_address();
  const auto start = std::chrono::steady_clock::now();
  Status rank0;
  std::thread r0([&] { rank0 = join_and_gather(address, 0); });
  ScopedFd big(connect_abstract(address));
  ASSERT_TRUE(big.valid());
  const unsigned char other[4] = {0, 7, 1, 2};  // the last datagram of a FETCH, cut short
  ASSERT_EQ(::send(big.get(), other, sizeof other, MSG_NOSIGNAL),
            static_cast<ssize_t>(sizeof other));
  std::this_thread::sleep_for(milliseconds(200));
  Status rank1 = join_and_gather(address, 1);
  r0.join();
  EXPECT_OK(rank0);
  EXPECT_OK(rank1);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
}

// A rank that joins with another group size fails the join on both sides, each naming the
// rank and the sizes: rank 0 tells it with ABORT rather than leaving it to its timeout.
TEST(LocalGroupPeers, AJoinOfAnotherGroupSizeFailsBothSidesNamingIt) {
  const std::string address = unique_address();
  const auto start = std::chrono::steady_clock::now();
  Status rank0;
  std::thread r0([&] {
    LocalGroupOptions o{address, 0, 2, "n0", milliseconds(10'000)};
    rank0 = connect_local_group(o).status();
  });
  LocalGroupOptions o{address, 1, 3, "n0", milliseconds(10'000)};
  Status rank1 = connect_local_group(o).status();
  r0.join();
  EXPECT_EQ(rank0.code(), Code::kInvalidArgument) << rank0.to_string();
  EXPECT_EQ(rank1.code(), Code::kInvalidArgument) << rank1.to_string();
  for (const Status& s : {rank0, rank1}) {
    EXPECT_NE(s.message().find("rank 1 ("), std::string::npos) << s.message();
    EXPECT_NE(s.message().find("(pid "), std::string::npos) << s.message();
    EXPECT_NE(s.message().find("joined a group of 3 ranks, rank 0 one of 2"), std::string::npos)
        << s.message();
  }
  EXPECT_NE(rank1.message().find("reported by rank 0"), std::string::npos) << rank1.message();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
}

TEST(LocalGroupPeers, TakenRootAddressSaysWhoHoldsIt) {
  const std::string address = unique_address();
  Status rank0;
  std::thread r0([&] {
    LocalGroupOptions o{address, 0, 2, "n0", milliseconds(1000)};
    rank0 = connect_local_group(o).status();  // waits for a rank 1 that never comes
  });
  ScopedFd probe(connect_abstract(address));  // rank 0 is listening now
  ASSERT_TRUE(probe.valid());
  LocalGroupOptions o{address, 0, 2, "n0", milliseconds(1000)};
  auto second = connect_local_group(o);
  r0.join();
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), Code::kAlreadyExists) << second.status().to_string();
  EXPECT_NE(second.status().message().find("pid " + std::to_string(::getpid())), std::string::npos)
      << second.status().message();
}

}  // namespace
}  // namespace ferry::rank_group::test
