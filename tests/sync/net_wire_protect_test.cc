// Net sync sessions under each SyncOptions::wire_protect mode: rounds arrive bit-exact, a
// byte changed on the path is caught before the bucket counts (mac, encrypt; none only by
// XXH3), and a receiver that asks for more than the sender gives refuses the session.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <map>
#include <thread>

#include "support/status_matchers.h"
#include "support/test_support.h"
#include "sync/net_test_util.h"
#include "sync/sync_test_util.h"
#include "transport/net/testing.h"

namespace ferry::sync {
namespace {

using testing::make_weights;
using testing::Weights;

struct ClearHooks {
  ~ClearHooks() { net::testing::set_bulk_tamper({}); }
};

std::vector<TensorSpec> model() {
  return {*TensorSpec::make("embed", DType::kBF16, {300, 512}),  // spans buckets
          *TensorSpec::make("norm", DType::kF32, {37}),
          *TensorSpec::make("lm_head", DType::kF32, {100, 129})};
}

class NetWireProtectSync : public ::testing::Test {
 protected:
  SyncOptions options(WireProtect mode) {
    SyncOptions o = testing::net_options(dir_);
    o.wire_protect = mode;
    return o;
  }

  // One sender (`send`) and one net receiver (`receive`), `rounds` rounds. Returns the
  // receiver's first error (OK if none) and, in *sender_status, the sender's.
  Status run(const SyncOptions& send, const SyncOptions& receive, int rounds,
             Status* sender_status) {
    auto sender = Sender::create("127.0.0.1:0", send);
    EXPECT_OK(sender);
    if (!sender.ok()) return sender.status();
    Status rx_status;
    std::map<std::string, std::vector<std::byte>> got;
    std::thread rx([&] {
      auto r = Receiver::connect((*sender)->address(), 0, receive);
      if (!r.ok()) {
        rx_status = r.status();
        return;
      }
      for (int round = 0; round < rounds; ++round) {
        auto s = (*r)->receive_round([&](const TensorView& t) {
          got[t.spec.name].assign(t.data.begin(), t.data.end());
          return ok_status();
        });
        if (!s.ok()) {
          rx_status = s.status();
          return;
        }
      }
    });
    *sender_status = (*sender)->accept(1);
    Weights w;
    for (int round = 1; round <= rounds && sender_status->ok(); ++round) {
      w = make_weights(model(), static_cast<std::uint64_t>(round));
      auto views = w.views();
      auto stats = (*sender)->send_round(views);
      if (!stats.ok()) *sender_status = stats.status();
    }
    rx.join();
    if (rx_status.ok() && sender_status->ok()) {
      for (std::size_t i = 0; i < w.specs.size(); ++i) {
        EXPECT_TRUE(got[w.specs[i].name] == w.data[i]) << w.specs[i].name;
      }
    }
    return rx_status;
  }

  ferry::testing::TempDir dir_;
};

TEST_F(NetWireProtectSync, RoundsAreBitExactInEveryMode) {
  for (auto mode : {WireProtect::kNone, WireProtect::kMac, WireProtect::kEncrypt}) {
    Status sender;
    Status rx = run(options(mode), options(mode), 2, &sender);
    EXPECT_OK(rx) << wire_protect_name(mode) << ": " << rx.to_string();
    EXPECT_OK(sender) << wire_protect_name(mode) << ": " << sender.to_string();
  }
}

TEST_F(NetWireProtectSync, RelayedRoundsAreBitExactUnderEncrypt) {
  const SyncOptions o = options(WireProtect::kEncrypt);
  auto sender = Sender::create("127.0.0.1:0", o);
  ASSERT_OK(sender);
  const std::string local = testing::unique_address();
  std::map<std::string, std::vector<std::byte>> got;
  std::thread relay_thread([&] {
    auto relay = Relay::connect((*sender)->address(), 1, local, o);
    ASSERT_OK(relay);
    ASSERT_OK((*relay)->accept(1));
    for (int r = 0; r < 2; ++r) {
      auto stats = (*relay)->relay_round();
      ASSERT_OK(stats);
    }
  });
  std::thread rx([&] {
    auto r = Receiver::connect(local, 0, o);
    ASSERT_OK(r);
    for (int round = 0; round < 2; ++round) {
      auto s = (*r)->receive_round([&](const TensorView& t) {
        got[t.spec.name].assign(t.data.begin(), t.data.end());
        return ok_status();
      });
      ASSERT_OK(s);
    }
  });
  ASSERT_OK((*sender)->accept(1));
  Weights w;
  for (std::uint64_t round = 1; round <= 2; ++round) {
    w = make_weights(model(), round);
    auto views = w.views();
    auto stats = (*sender)->send_round(views);
    ASSERT_OK(stats);
  }
  relay_thread.join();
  rx.join();
  for (std::size_t i = 0; i < w.specs.size(); ++i) {
    EXPECT_TRUE(got[w.specs[i].name] == w.data[i]) << w.specs[i].name;
  }
}

TEST_F(NetWireProtectSync, TamperedBulkByteIsCorruptionNamingPeerAndBucket) {
  for (auto mode : {WireProtect::kMac, WireProtect::kEncrypt}) {
    ClearHooks clear;
    net::testing::set_bulk_tamper([](std::span<std::byte> b) { b[b.size() / 3] ^= std::byte{4}; });
    Status sender;
    Status rx = run(options(mode), options(mode), 1, &sender);
    EXPECT_EQ(rx.code(), Code::kCorruption) << wire_protect_name(mode) << ": " << rx.to_string();
    EXPECT_NE(rx.message().find("bucket 0"), std::string::npos) << rx.message();
    EXPECT_NE(rx.message().find("failed authentication"), std::string::npos) << rx.message();
    EXPECT_NE(rx.message().find("sender at 127.0.0.1:"), std::string::npos) << rx.message();
    EXPECT_FALSE(sender.ok()) << "the sender reported a round whose bytes were tampered with";
  }
}

TEST_F(NetWireProtectSync, TamperUnderNoneIsCaughtOnlyByChecksums) {
  ClearHooks clear;
  net::testing::set_bulk_tamper([](std::span<std::byte> b) { b[b.size() / 3] ^= std::byte{4}; });
  Status sender;
  Status rx = run(options(WireProtect::kNone), options(WireProtect::kNone), 1, &sender);
  EXPECT_EQ(rx.code(), Code::kCorruption) << rx.to_string();
  EXPECT_NE(rx.message().find("checksum"), std::string::npos) << rx.message();
  EXPECT_EQ(rx.message().find("failed authentication"), std::string::npos) << rx.message();
}

TEST_F(NetWireProtectSync, ReceiverRequiringMacRefusesANoneSession) {
  Status sender;
  Status rx = run(options(WireProtect::kNone), options(WireProtect::kMac), 1, &sender);
  EXPECT_EQ(rx.code(), Code::kFailedPrecondition) << rx.to_string();
  EXPECT_NE(rx.message().find("'none'"), std::string::npos) << rx.message();
  EXPECT_NE(rx.message().find("at least 'mac'"), std::string::npos) << rx.message();
  EXPECT_FALSE(sender.ok());
}

}  // namespace
}  // namespace ferry::sync
