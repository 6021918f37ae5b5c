// A relay is any transport out and any in but shm (the ring it serves is its own): here its
// local receiver joins over net, and an address of an unknown scheme, or an upstream on this
// node's shared memory, is refused naming it before anything connects.
#include <gtest/gtest.h>

#include <future>
#include <map>
#include <thread>

#include "support/status_matchers.h"
#include "support/test_support.h"
#include "sync/net_test_util.h"
#include "sync/sync_test_util.h"

namespace ferry::sync {
namespace {

using testing::make_weights;
using testing::Weights;

std::vector<TensorSpec> model() {
  return {*TensorSpec::make("embed", DType::kBF16, {300, 512}),  // 300 KiB: spans buckets
          *TensorSpec::make("norm", DType::kF32, {37})};
}

TEST(RelayAnyTransport, LocalReceiverJoinsOverNet) {
  ferry::testing::TempDir dir;
  const SyncOptions o = testing::net_options(dir);
  auto sender = Sender::create("127.0.0.1:0", o);
  ASSERT_OK(sender);
  constexpr int kRounds = 2;
  std::promise<std::string> local_address;
  Status relay_status = internal_error("not run");
  Status receiver_status = internal_error("not run");
  std::map<std::string, std::vector<std::byte>> got;
  std::thread relay_thread([&] {
    auto relay = Relay::connect((*sender)->address(), 0, "127.0.0.1:0", o);
    local_address.set_value(relay.ok() ? (*relay)->local_address() : std::string());
    if (!relay.ok()) {
      relay_status = relay.status();
      return;
    }
    relay_status = (*relay)->accept(1);
    for (int r = 0; r < kRounds && relay_status.ok(); ++r) {
      relay_status = (*relay)->relay_round().status();
    }
  });
  std::thread receiver_thread([&] {
    const std::string address = local_address.get_future().get();
    if (address.empty()) return;
    auto r = Receiver::connect(address, 0, o);
    if (!r.ok()) {
      receiver_status = r.status();
      return;
    }
    for (int round = 0; round < kRounds; ++round) {
      receiver_status = (*r)->receive_round([&](const TensorView& t) {
                              got[t.spec.name].assign(t.data.begin(), t.data.end());
                              return ok_status();
                            })
                            .status();
      if (!receiver_status.ok()) return;
    }
  });
  Status sent = (*sender)->accept(1);
  Weights w;
  for (std::uint64_t round = 1; round <= kRounds && sent.ok(); ++round) {
    w = make_weights(model(), round);
    auto views = w.views();
    sent = (*sender)->send_round(views).status();
  }
  if (!sent.ok()) (*sender).reset();  // the relay and its receiver see the session end
  relay_thread.join();
  receiver_thread.join();
  ASSERT_OK(sent);
  EXPECT_OK(relay_status);
  ASSERT_OK(receiver_status);
  for (std::size_t i = 0; i < w.specs.size(); ++i) {
    EXPECT_TRUE(got[w.specs[i].name] == w.data[i]) << w.specs[i].name;
  }
}

TEST(RelayAnyTransport, UnknownSchemeIsRefusedNamingTheAddress) {
  ferry::testing::TempDir dir;
  const SyncOptions o = testing::net_options(dir);
  for (const auto& [local, relays] : {std::pair<std::string, std::string>{"rdma://10.0.0.1:1", ""},
                                      {testing::unique_address(), "rdma://10.0.0.1:1"}}) {
    auto relay = Relay::connect("127.0.0.1:1", 0, local, o, relays);
    ASSERT_FALSE(relay.ok());
    EXPECT_EQ(relay.status().code(), Code::kInvalidArgument) << relay.status().to_string();
    EXPECT_NE(relay.status().message().find("unknown transport scheme 'rdma' in address "
                                            "'rdma://10.0.0.1:1'"),
              std::string::npos)
        << relay.status().message();
  }
}

TEST(RelayAnyTransport, UpstreamOnSharedMemoryIsRefused) {
  ferry::testing::TempDir dir;
  const SyncOptions o = testing::net_options(dir);
  auto relay = Relay::connect("@ferry-no-such-sender", 0, testing::unique_address(), o);
  ASSERT_FALSE(relay.ok());
  EXPECT_EQ(relay.status().code(), Code::kInvalidArgument) << relay.status().to_string();
  EXPECT_NE(relay.status().message().find("'@ferry-no-such-sender' is not a host:port address"),
            std::string::npos)
      << relay.status().message();
}

}  // namespace
}  // namespace ferry::sync
