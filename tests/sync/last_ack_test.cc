// Receivers that exit right after their last ACK, as `ferry sync recv --rounds N` does: the
// sender's last round must succeed, since every receiver took and acknowledged every
// tensor. The ACK arrives before the receiver's end (its socket's EOF, UCX's error, the
// bootstrap socket's EOF), and the sender must count it whichever it notices first.
//
// Receivers are this test binary re-executed (FERRY_LAST_ACK_TEST_CHILD set; the role runs
// before main()), not a bare fork: UCX state does not survive a fork. A receiver either
// closes its session (the FIN handshake on net) or exits at once without closing anything,
// as a killed or _exit()ing process does.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "base/clock.h"
#include "base/subprocess.h"
#include "support/status_matchers.h"
#include "support/test_support.h"
#include "sync/net_test_util.h"
#include "sync/sync_test_util.h"

namespace ferry::sync {
namespace {

using std::chrono::milliseconds;
using testing::make_weights;
using testing::small_model;
using testing::write_token;

constexpr const char* kChildVariable = "FERRY_LAST_ACK_TEST_CHILD";
constexpr int kRounds = 3;

// How a receiver ends after its last round.
enum class End { kClose, kExit };

SyncOptions options(const std::string& token_file) {
  SyncOptions o;
  o.bucket_bytes = 256 << 10;  // the big tensor spans buckets, sent by UCX's rendezvous
  o.slots = 2;
  o.timeout = milliseconds(20'000);
  o.token_file = token_file;
  return o;
}

// Small tensors and one of 1 MiB.
std::vector<TensorSpec> model() {
  std::vector<TensorSpec> specs = small_model();
  specs.push_back(*TensorSpec::make("big", DType::kBF16, {512, 1024}));
  return specs;
}

// The child: "<address> <id> <close|exit> <token file or ->"; joins, receives kRounds rounds
// and ends as told. Exit codes: 0 done, 2 could not join, 3 a round failed.
[[noreturn]] void run_receiver(const char* spec) {
  std::istringstream in(spec);
  std::string address, how, token_file;
  std::uint32_t id = 0;
  in >> address >> id >> how >> token_file;
  const SyncOptions o = options(token_file == "-" ? "" : token_file);
  auto rx = Receiver::connect(address, id, o);
  if (!rx.ok()) std::_Exit(2);
  for (int round = 0; round < kRounds; ++round) {
    auto got = (*rx)->receive_round([](const TensorView&) { return ok_status(); });
    if (!got.ok()) std::_Exit(3);
  }
  if (how == "exit") std::_Exit(0);  // nothing closed: the kernel ends the connections
  rx->reset();
  std::_Exit(0);
}

const bool kChildRan = [] {
  if (const char* spec = std::getenv(kChildVariable)) run_receiver(spec);
  return false;
}();

std::string child_spec(const std::string& address, std::uint32_t id, End end,
                       const std::string& token_file) {
  return std::string(kChildVariable) + "=" + address + " " + std::to_string(id) + " " +
         (end == End::kExit ? "exit" : "close") + " " + (token_file.empty() ? "-" : token_file);
}

std::string self_path() {
  char self[4096] = {};
  const ssize_t n = ::readlink("/proc/self/exe", self, sizeof self - 1);
  return n > 0 ? std::string(self, static_cast<std::size_t>(n)) : std::string();
}

// Runs kRounds rounds to `receivers` receiver processes that end as `end` says after the
// last; every round must succeed and every receiver exit 0.
void run_session(const std::string& address, const std::string& token_file, End end,
                 std::uint32_t receivers) {
  const SyncOptions o = options(token_file);
  auto sender = Sender::create(address, o);
  ASSERT_OK(sender);
  std::vector<Subprocess> kids;
  for (std::uint32_t id = 0; id < receivers; ++id) {
    SpawnOptions spawn;
    spawn.output = ChildOutput::kInherit;
    spawn.env.push_back(child_spec((*sender)->address(), id, end, token_file));
    auto kid = Subprocess::spawn({self_path()}, spawn);
    ASSERT_OK(kid);
    kids.push_back(std::move(*kid));
  }
  ASSERT_OK((*sender)->accept(receivers));
  for (int round = 1; round <= kRounds; ++round) {
    const testing::Weights w = make_weights(model(), static_cast<std::uint64_t>(round));
    const auto views = w.views();
    auto stats = (*sender)->send_round(views);
    ASSERT_OK(stats) << "round " << round << " of " << kRounds;
  }
  for (Subprocess& kid : kids) {
    const auto exit = kid.wait(Deadline(std::chrono::seconds(30)));
    ASSERT_TRUE(exit.has_value()) << kid.name() << " did not exit";
    EXPECT_EQ(exit->code, 0) << kid.name();
  }
}

TEST(LastAck, ShmReceiversThatCloseRightAfterTheirLastAck) {
  run_session(testing::unique_address(), "", End::kClose, 3);
}

TEST(LastAck, ShmReceiversThatExitRightAfterTheirLastAck) {
  run_session(testing::unique_address(), "", End::kExit, 3);
}

TEST(LastAck, NetReceiversThatCloseRightAfterTheirLastAck) {
  ferry::testing::TempDir dir;
  run_session("127.0.0.1:0", write_token(dir), End::kClose, 2);
}

TEST(LastAck, NetReceiversThatExitRightAfterTheirLastAck) {
  ferry::testing::TempDir dir;
  run_session("127.0.0.1:0", write_token(dir), End::kExit, 2);
}

}  // namespace
}  // namespace ferry::sync
