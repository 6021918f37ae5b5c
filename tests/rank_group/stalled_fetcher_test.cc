// A fetcher that speaks the protocol by hand and stops taking an answer's pieces (shm: the
// server waits for TAKEN before it reuses a slot of the window). The server's wait is in
// slices, so the group still closes at once, not at its fetch timeout.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "base/file_util.h"
#include "ferry/rank_group.h"
#include "rank_group/constants.h"
#include "rank_group/group_test_util.h"
#include "rank_group/messages.h"
#include "support/status_matchers.h"
#include "transport/registry.h"

namespace ferry::rank_group::test {
namespace {

using std::chrono::milliseconds;

TEST(StalledFetcher, AGroupClosesAtOnceWhileAFetcherHoldsItsWindow) {
  const std::string root = unique_address();
  const milliseconds timeout(20'000);
  Result<std::unique_ptr<RankGroup>> g = invalid_argument("not joined");
  std::thread r0([&] { g = checkpoint::connect_local_group({root, 0, 2, "n0", timeout}); });

  // Rank 1, by hand: JOIN, then the member table says where rank 0 serves fetches.
  transport::Registry reg(transport::TransportConfig{});
  auto ch = reg.connect(root, timeout, "rank 0");
  ASSERT_OK(ch);
  ASSERT_OK((*ch)->send(msg::encode_join({kVersion, 1, 2, "n1", "@unused"}), timeout));
  auto table = (*ch)->receive(timeout);
  ASSERT_OK(table);
  auto members = msg::decode_table(*table, 2);
  ASSERT_OK(members);
  r0.join();
  ASSERT_OK(g);

  // An answer of four pieces: the server fills both slots, then waits for TAKEN of piece 0.
  const std::string big(3 * kAnswerSlotBytes + 1, 'x');
  (*g)->set_fetch_handler([&big](int, std::string_view) -> Result<RankGroup::FetchReply> {
    return RankGroup::FetchReply{.owned = big};
  });
  auto f = reg.connect(members->addresses[0], timeout, "rank 0");
  ASSERT_OK(f);
  ASSERT_OK((*f)->send(msg::encode_fetch_hello({kVersion, 1}), timeout));
  ASSERT_OK((*f)->send(msg::encode_fetch({1, kAnySize, "big"}), timeout));
  ScopedFd window;
  auto answer = (*f)->receive_with_fd(timeout, &window);
  ASSERT_OK(answer);
  EXPECT_TRUE(window.valid());
  for (std::uint32_t k = 0; k < kAnswerSlots; ++k) {
    auto piece = (*f)->receive(timeout);
    ASSERT_OK(piece);
    auto p = msg::decode_piece(*piece, msg::Kind::kPiece);
    ASSERT_OK(p);
    EXPECT_EQ(p->index, k);
  }

  // No TAKEN: the server is waiting. Closing the group ends that wait at once.
  const auto start = std::chrono::steady_clock::now();
  g->reset();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
}

}  // namespace
}  // namespace ferry::rank_group::test
