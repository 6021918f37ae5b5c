// A local receiver killed mid-round behind a relay, over the net transport on 127.0.0.1:
// the sender's error must name that receiver, as the relay reported it, not only the relay
// whose link then closed. The receivers are child processes (forked before any UCX context
// exists, so the kill is a real one); the relay runs in a thread beside the sender.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <future>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "base/clock.h"
#include "support/status_matchers.h"
#include "support/test_support.h"
#include "sync/net_test_util.h"
#include "sync/sync_test_util.h"

namespace ferry::sync {
namespace {

using testing::make_weights;
using testing::Weights;

SyncOptions relay_options(ferry::testing::TempDir& dir) {
  SyncOptions o = testing::net_options(dir);
  o.bucket_bytes = 16 << 10;  // ~20 buckets a round
  o.slots = 4;
  return o;
}

std::vector<TensorSpec> relay_model() {
  return {*TensorSpec::make("embed", DType::kBF16, {300, 512}),  // 300 KiB: spans buckets
          *TensorSpec::make("norm", DType::kF32, {37}),
          *TensorSpec::make("lm_head", DType::kF32, {100, 129})};
}

// A local receiver process of `rounds` rounds. With `die_in_round` it kills itself
// (SIGKILL) on its tenth bucket of that round; with `pause_in_round` it stops for 1.5 s on
// its ninth bucket of that round.
pid_t spawn_receiver(const std::string& local, std::uint32_t id, const SyncOptions& o, int rounds,
                     int die_in_round, int pause_in_round) {
  const pid_t pid = ::fork();
  if (pid != 0) return pid;
  auto r = Receiver::connect(local, id, o);
  if (!r.ok()) ::_exit(10);
  for (int round = 1; round <= rounds; ++round) {
    int buckets = 0;
    auto got = (*r)->receive_round_buckets([&](std::span<const TensorView>, bool) {
      ++buckets;
      if (round == die_in_round && buckets == 10) ::kill(::getpid(), SIGKILL);
      if (round == pause_in_round && buckets == 9) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1500));
      }
      return ok_status();
    });
    if (!got.ok()) ::_exit(11);
  }
  ::_exit(0);
}

int wait_exit(pid_t pid) {
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// One node: a relay in a thread serving local receivers (processes) and, optionally,
// downstream relays.
struct Node {
  std::string local = testing::unique_address();
  std::vector<pid_t> receivers;
  std::thread relay;
  Status relay_status;
  std::promise<std::string> serves;  // its address for downstream relays ("" when none)
};

void start_relay(Node& node, const std::string& upstream, std::uint32_t id, const SyncOptions& o,
                 int rounds, std::uint32_t downstream = 0) {
  node.relay = std::thread([&node, upstream, id, o, rounds, downstream] {
    auto relay =
        Relay::connect(upstream, id, node.local, o, downstream > 0 ? "127.0.0.1:0" : std::string());
    node.serves.set_value(relay.ok() ? (*relay)->relays_address() : std::string());
    if (!relay.ok()) {
      node.relay_status = relay.status();
      return;
    }
    node.relay_status =
        (*relay)->accept(static_cast<std::uint32_t>(node.receivers.size()), downstream);
    for (int round = 1; round <= rounds && node.relay_status.ok(); ++round) {
      node.relay_status = (*relay)->relay_round().status();
    }
  });
}

// Relay `id` and its one local receiver in a child process that kills itself (relay and
// all) on the receiver's tenth bucket of round `die_in_round`. Forked before the test makes
// a UCX context; it reads its upstream's address, a line, from `address_pipe`.
struct ChildRelay {
  pid_t pid = -1;
  int address_pipe = -1;
};

ChildRelay spawn_relay(std::uint32_t id, const SyncOptions& o, int rounds, int die_in_round) {
  int fds[2];
  if (::pipe(fds) != 0) return {};
  const pid_t pid = ::fork();
  if (pid != 0) {
    ::close(fds[0]);
    return {pid, fds[1]};
  }
  ::close(fds[1]);
  std::string upstream;
  char c = 0;
  while (::read(fds[0], &c, 1) == 1 && c != '\n') upstream += c;
  const std::string local = testing::unique_address();
  std::thread receiver([&] {
    auto r = Receiver::connect(local, 0, o);
    for (int round = 1; r.ok() && round <= rounds; ++round) {
      int buckets = 0;
      auto got = (*r)->receive_round_buckets([&](std::span<const TensorView>, bool) {
        if (round == die_in_round && ++buckets == 10) ::kill(::getpid(), SIGKILL);
        return ok_status();
      });
      if (!got.ok()) return;
    }
  });
  auto relay = Relay::connect(upstream, id, local, o);
  Status s = relay.ok() ? (*relay)->accept(1) : relay.status();
  for (int round = 1; round <= rounds && s.ok(); ++round) s = (*relay)->relay_round().status();
  receiver.join();
  ::_exit(s.ok() ? 0 : 12);
}

// Two nodes as in verl (a relay and two ranks each). In round 2 node 0's receiver 1 dies
// while node 1 pauses, so the sender is waiting on node 1, not on node 0, when node 0's
// relay reports the death: the report must still reach the sender and name the receiver,
// not only the relay whose link then closed.
TEST(RelayFailure, ReceiverKilledBehindARelayIsNamedAtTheSender) {
  ferry::testing::TempDir dir;
  const SyncOptions o = relay_options(dir);
  Node nodes[2];
  // Forked before any UCX context exists in this test.
  nodes[0].receivers = {spawn_receiver(nodes[0].local, 0, o, 2, 0, 0),
                        spawn_receiver(nodes[0].local, 1, o, 2, /*die_in_round=*/2, 0)};
  nodes[1].receivers = {spawn_receiver(nodes[1].local, 0, o, 2, 0, /*pause_in_round=*/2),
                        spawn_receiver(nodes[1].local, 1, o, 2, 0, 0)};
  auto sender = Sender::create("127.0.0.1:0", o);
  ASSERT_OK(sender);
  for (std::uint32_t id = 0; id < 2; ++id) start_relay(nodes[id], (*sender)->address(), id, o, 2);
  ASSERT_OK((*sender)->accept(2));
  Weights w = make_weights(relay_model(), 1);
  auto views = w.views();
  ASSERT_OK((*sender)->send_round(views));
  w = make_weights(relay_model(), 2);
  views = w.views();
  const auto start = Clock::now();
  auto failed = (*sender)->send_round(views);
  const auto took = Clock::now() - start;
  (*sender).reset();  // ends the session for node 1 too
  for (Node& node : nodes) node.relay.join();
  EXPECT_EQ(wait_exit(nodes[0].receivers[1]), 128 + SIGKILL);
  for (pid_t pid : {nodes[0].receivers[0], nodes[1].receivers[0], nodes[1].receivers[1]}) {
    (void)wait_exit(pid);  // each hears its relay's ERROR (or had the whole round first)
  }

  ASSERT_FALSE(failed.ok());
  const std::string why = failed.status().to_string();
  // The dead rank, as its relay named it, and the relay that reported it.
  EXPECT_NE(why.find("local receiver 1"), std::string::npos) << why;
  EXPECT_NE(why.find("relay 0"), std::string::npos) << why;
  EXPECT_NE(why.find("round 2"), std::string::npos) << why;
  EXPECT_LT(took, o.timeout) << why;
  EXPECT_FALSE(nodes[0].relay_status.ok());
  EXPECT_NE(nodes[0].relay_status.to_string().find("local receiver 1"), std::string::npos)
      << nodes[0].relay_status.to_string();
}

// A chain (sender -> relay 0 -> relay 1) beside a node fed by the sender directly (relay 2).
// In round 2 relay 1's process is killed while relay 2's receiver pauses: relay 0 must get
// its report of relay 1 to the sender, which names relay 1, not only relay 0.
TEST(RelayFailure, RelayKilledDownTheChainIsNamedAtTheSender) {
  ferry::testing::TempDir dir;
  const SyncOptions o = relay_options(dir);
  Node head, beside;
  head.receivers = {spawn_receiver(head.local, 0, o, 2, 0, 0)};
  beside.receivers = {spawn_receiver(beside.local, 0, o, 2, 0, /*pause_in_round=*/2)};
  const ChildRelay tail = spawn_relay(1, o, 2, /*die_in_round=*/2);
  ASSERT_GT(tail.pid, 0);
  auto sender = Sender::create("127.0.0.1:0", o);
  ASSERT_OK(sender);
  start_relay(head, (*sender)->address(), 0, o, 2, /*downstream=*/1);
  start_relay(beside, (*sender)->address(), 2, o, 2);
  ASSERT_OK((*sender)->accept(2));
  const std::string line = head.serves.get_future().get() + "\n";
  ASSERT_EQ(::write(tail.address_pipe, line.data(), line.size()),
            static_cast<ssize_t>(line.size()));
  ::close(tail.address_pipe);
  Weights w = make_weights(relay_model(), 1);
  auto views = w.views();
  ASSERT_OK((*sender)->send_round(views));
  w = make_weights(relay_model(), 2);
  views = w.views();
  auto failed = (*sender)->send_round(views);
  (*sender).reset();
  for (Node* node : {&head, &beside}) node->relay.join();
  EXPECT_EQ(wait_exit(tail.pid), 128 + SIGKILL);
  for (pid_t pid : {head.receivers[0], beside.receivers[0]}) (void)wait_exit(pid);

  ASSERT_FALSE(failed.ok());
  const std::string why = failed.status().to_string();
  EXPECT_NE(why.find("relay 0: round 2: relay 1"), std::string::npos) << why;
  EXPECT_NE(head.relay_status.to_string().find("relay 1"), std::string::npos)
      << head.relay_status.to_string();
}

// Relay::stop (Python) and Ctrl-C (CLI) reach a relay through options.interrupt: heard inside
// a round too, while the relay waits for a local receiver that holds a bucket (here for
// longer than the session's timeout would take), not only between rounds.
TEST(RelayFailure, RelayHearsInterruptInsideARound) {
  ferry::testing::TempDir dir;
  const SyncOptions o = relay_options(dir);
  auto sender = Sender::create("127.0.0.1:0", o);
  ASSERT_OK(sender);
  std::atomic<bool> stop{false};
  SyncOptions stoppable = o;
  stoppable.interrupt = [&] { return stop ? aborted("the relay was stopped") : ok_status(); };
  const std::string local = testing::unique_address();
  Status relayed = internal_error("not run");
  std::thread relay([&] {
    auto r = Relay::connect((*sender)->address(), 0, local, stoppable);
    relayed = r.ok() ? (*r)->accept(1) : r.status();
    if (relayed.ok()) relayed = (*r)->relay_round().status();
  });
  std::promise<void> holding;
  std::promise<void> let_go;
  std::thread receiver([&, let = let_go.get_future().share()] {
    auto r = Receiver::connect(local, 0, o);
    if (!r.ok()) return holding.set_value();
    bool first = true;
    (void)(*r)->receive_round_buckets([&](std::span<const TensorView>, bool) {
      if (std::exchange(first, false)) {
        holding.set_value();
        let.wait();
      }
      return ok_status();
    });
  });
  ASSERT_OK((*sender)->accept(1));
  Weights w = make_weights(relay_model(), 1);
  const auto views = w.views();
  Result<RoundStats> sent = internal_error("not run");
  std::thread sending([&] { sent = (*sender)->send_round(views); });
  holding.get_future().wait();
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the relay waits in the round
  stop = true;
  const auto start = Clock::now();
  relay.join();
  const auto took = Clock::now() - start;
  let_go.set_value();
  receiver.join();
  sending.join();
  EXPECT_EQ(relayed.code(), Code::kAborted) << relayed.to_string();
  EXPECT_NE(relayed.message().find("stopped"), std::string::npos) << relayed.to_string();
  EXPECT_LT(took, std::chrono::seconds(3)) << relayed.to_string();
  ASSERT_FALSE(sent.ok());
  EXPECT_NE(sent.status().to_string().find("relay 0"), std::string::npos)
      << sent.status().to_string();
}

}  // namespace
}  // namespace ferry::sync
