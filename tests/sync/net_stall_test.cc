// A net receiver that stops reading mid-round, then goes away, must not take the sender with
// it: the round fails naming that receiver, and the sender serves the next session. (Debian's
// UCX 1.13 aborted a replicate server in that case while zero-copy sends to the peer were
// queued; docs/transport-net.md.)
#include <gtest/gtest.h>
#include <stdlib.h>

#include <chrono>
#include <future>
#include <thread>

#include "support/status_matchers.h"
#include "support/test_support.h"
#include "sync/net_test_util.h"
#include "sync/sync_test_util.h"

namespace ferry::sync {
namespace {

using std::chrono::milliseconds;
using testing::make_weights;
using testing::Weights;
using testing::write_token;

// Buckets far larger than the socket buffers, so a receiver that does not read leaves the
// sender's sends queued.
std::vector<TensorSpec> big_model() {
  return {*TensorSpec::make("embed", DType::kBF16, {16384, 2048})};  // 64 MiB
}

// Leaves mid-round (the sender sees it end with sends queued), or after the sender gave up on
// it (the sender's endpoint is gone first, then the peer ends: what broke the replicate server).
class NetStall : public ::testing::TestWithParam<bool> {};

TEST_P(NetStall, AReceiverThatStopsReadingThenLeavesDoesNotCrashTheSender) {
  const bool leaves_before_timeout = GetParam();
  ferry::testing::TempDir dir;
  SyncOptions o;
  o.bucket_bytes = 16 << 20;
  o.timeout = milliseconds(4000);
  o.token_file = write_token(dir);
  o.checksums = false;
  o.max_ring_bytes = 64ull << 20;
  auto sender = Sender::create("127.0.0.1:0", o);
  ASSERT_OK(sender);
  const std::string address = (*sender)->address();

  auto good = std::async(std::launch::async, [&]() -> Status {
    auto r = Receiver::connect(address, 0, o);
    if (!r.ok()) return r.status();
    return (*r)->receive_round([](const TensorView&) { return ok_status(); }).status();
  });
  auto accepted = std::async(std::launch::async, [&] { return (*sender)->accept(2); });
  auto stalled = Receiver::connect(address, 1, o);  // joins, then never reads
  ASSERT_OK(stalled);
  ASSERT_OK(accepted.get());

  Weights w = make_weights(big_model(), 1);
  auto round = std::async(std::launch::async, [&] {
    auto views = w.views();
    return (*sender)->send_round(views).status();
  });
  std::this_thread::sleep_for(milliseconds(800));  // the sender is now writing into it
  if (leaves_before_timeout) stalled->reset();
  const Status failed = round.get();
  EXPECT_FALSE(failed.ok());
  EXPECT_NE(failed.message().find("receiver 1"), std::string::npos) << failed.to_string();
  if (!leaves_before_timeout) {
    std::this_thread::sleep_for(milliseconds(300));
    stalled->reset();
  }
  (void)good.get();
  std::this_thread::sleep_for(milliseconds(1000));  // late completions for the dead peer

  // The next session works.
  auto next = std::async(std::launch::async, [&]() -> Status {
    auto r = Receiver::connect(address, 0, o);
    if (!r.ok()) return r.status();
    return (*r)->receive_round([](const TensorView&) { return ok_status(); }).status();
  });
  ASSERT_OK((*sender)->accept(1));
  auto views = w.views();
  EXPECT_OK((*sender)->send_round(views).status());
  EXPECT_OK(next.get());
}

INSTANTIATE_TEST_SUITE_P(LeavesBeforeOrAfterTheSenderGivesUp, NetStall, ::testing::Bool());

}  // namespace
}  // namespace ferry::sync
