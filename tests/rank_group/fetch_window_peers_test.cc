// Peers of the shm fetch window (docs/protocol.md, PIECE / TAKEN) that speak the protocol by
// hand and break it. A fetcher that stops taking an answer's pieces (the server waits for
// TAKEN before it reuses a slot): the server's wait is in slices, so the group still closes
// at once, not at its fetch timeout. A server that lies about the pieces or passes a window
// too small: the fetch fails naming it.
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

// A server that speaks the protocol by hand and lies about an answer's pieces: the fetcher
// reads a piece only where the PIECE names the next one of this answer, from a window large
// enough to hold it, and fails naming the server otherwise.
class HostileServer {
 public:
  HostileServer() : reg_(transport::TransportConfig{}) {}

  // Joins a group of 2 as rank 1, serving at an address of its own; the real rank 0.
  void join(const std::string& root, milliseconds timeout) {
    serving_ = unique_address();
    auto listener = reg_.listen(serving_);
    ASSERT_OK(listener);
    listener_ = std::move(*listener);
    std::thread r0([&] { group_ = checkpoint::connect_local_group({root, 0, 2, "n0", timeout}); });
    auto ch = reg_.connect(root, timeout, "rank 0");
    ASSERT_OK(ch);
    ASSERT_OK((*ch)->send(msg::encode_join({kVersion, 1, 2, "n1", serving_}), timeout));
    ASSERT_OK((*ch)->receive(timeout));  // the member table
    r0.join();
    ASSERT_OK(group_);
    root_channel_ = std::move(*ch);  // rank 1 stays in the group
  }

  // Takes the fetcher's next channel (it drops one that failed) and answers its fetch with
  // `size` bytes through `window`, then sends `pieces` (id 0: the fetch's).
  void answer(std::uint64_t size, const transport::Ring& window,
              const std::vector<msg::Piece>& pieces, milliseconds timeout) {
    auto channel = listener_->accept(timeout);
    ASSERT_OK(channel);
    fetcher_ = std::move(*channel);
    ASSERT_OK(fetcher_->receive(timeout));  // FETCH_HELLO
    auto fetch = fetcher_->receive(timeout);
    ASSERT_OK(fetch);
    auto f = msg::decode_fetch(*fetch);
    ASSERT_OK(f);
    ASSERT_OK(fetcher_->send_with_fd(msg::encode_answer({f->id, Code::kOk, size, ""}), timeout,
                                     window.share_fd()));
    for (msg::Piece p : pieces) {
      if (p.id == 0) p.id = f->id;
      ASSERT_OK(fetcher_->send(msg::encode_piece(msg::Kind::kPiece, p), timeout));
    }
  }

  RankGroup& group() { return **group_; }
  transport::Transport& shm() { return **reg_.for_address(serving_); }

 private:
  transport::Registry reg_;
  std::string serving_;
  std::unique_ptr<transport::Listener> listener_;
  Result<std::unique_ptr<RankGroup>> group_ = invalid_argument("not joined");
  std::unique_ptr<transport::Channel> root_channel_;
  std::unique_ptr<transport::Channel> fetcher_;
};

TEST(HostileFetchServer, APieceOutOfOrderOrAWindowTooSmallFailsTheFetchNamingTheServer) {
  const milliseconds timeout(10'000);
  HostileServer server;
  server.join(unique_address(), timeout);
  auto window = server.shm().allocate_ring(kAnswerSlots, kAnswerSlotBytes);
  ASSERT_OK(window);

  // Piece 1 where piece 0 is due.
  Status fetched;
  std::thread fetcher([&] {
    std::vector<std::byte> into(kAnswerSlotBytes + 10);
    fetched = server.group().fetch_into(1, "x", into);
  });
  server.answer(kAnswerSlotBytes + 10, **window, {{0, 1}}, timeout);
  fetcher.join();
  EXPECT_EQ(fetched.code(), Code::kCorruption) << fetched.to_string();
  EXPECT_NE(fetched.message().find("sent piece 1 of answer"), std::string::npos)
      << fetched.to_string();
  EXPECT_NE(fetched.message().find("rank 1"), std::string::npos) << fetched.to_string();

  // A window of one small slot, for an answer whose first piece does not fit in it.
  auto small = server.shm().allocate_ring(1, 4096);
  ASSERT_OK(small);
  std::thread again([&] {
    std::vector<std::byte> into(kAnswerSlotBytes + 10);
    fetched = server.group().fetch_into(1, "x", into);
  });
  server.answer(kAnswerSlotBytes + 10, **small, {{0, 0}}, timeout);
  again.join();
  EXPECT_EQ(fetched.code(), Code::kCorruption) << fetched.to_string();
  EXPECT_NE(fetched.message().find("less than the"), std::string::npos) << fetched.to_string();
}

}  // namespace
}  // namespace ferry::rank_group::test
