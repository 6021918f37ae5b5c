// Local (shm) peers that do not play by the rules: a receiver that tries to write the
// ring it was handed, a process of another user, and one that connects and says nothing.
// Issue #14, items 10-12.
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <optional>
#include <thread>

#include "support/status_matchers.h"
#include "support/test_support.h"
#include "sync/sync_test_util.h"
#include "transport/shm/seqpacket_channel.h"
#include "wire/message.h"

namespace ferry::sync {
namespace {

using std::chrono::milliseconds;
using testing::make_weights;
using testing::small_model;
using testing::tiny_options;
using testing::unique_address;

// A hand-written receiver: says HELLO, keeps the ring descriptor WELCOME carried. Its
// channel stays open: a receiver that left before its first round does not count as joined.
struct HandJoined {
  std::optional<shm::Channel> channel;
  ScopedFd ring;
};
HandJoined join_and_take_ring(const std::string& address) {
  HandJoined out;
  auto ch = shm::connect(address, milliseconds(5000));
  EXPECT_OK(ch);
  if (!ch.ok()) return out;
  wire::Message hello;
  hello.body = wire::Hello{3, static_cast<std::uint32_t>(::getpid())};
  EXPECT_OK(ch->send(wire::encode(hello), milliseconds(1000)));
  auto got = ch->receive(milliseconds(5000));
  EXPECT_OK(got);
  if (!got.ok()) return out;
  auto m = wire::decode(got->bytes, "sender");
  EXPECT_TRUE(m.ok() && m->type() == wire::MessageType::kWelcome);
  out.channel = std::move(*ch);
  out.ring = std::move(got->fd);
  return out;
}

TEST(ShmRing, ReceiverCannotWriteOrMapWritableTheRingItIsGiven) {
  const std::string address = unique_address();
  SyncOptions o = tiny_options();
  auto sender = Sender::create(address, o);
  ASSERT_OK(sender);
  HandJoined joined;
  std::thread rx([&] { joined = join_and_take_ring(address); });
  ASSERT_OK((*sender)->accept(1));
  rx.join();
  const ScopedFd& ring = joined.ring;
  ASSERT_TRUE(ring.valid());
  const std::size_t bytes = std::size_t{o.slots} * o.bucket_bytes;

  EXPECT_EQ(::fcntl(ring.get(), F_GETFL) & O_ACCMODE, O_RDONLY) << "the fd is opened for writing";
  void* w = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, ring.get(), 0);
  EXPECT_EQ(w, MAP_FAILED) << "mmap(PROT_WRITE, MAP_SHARED) of the receiver's fd succeeded";
  if (w != MAP_FAILED) ::munmap(w, bytes);
  void* r = ::mmap(nullptr, bytes, PROT_READ, MAP_SHARED, ring.get(), 0);
  ASSERT_NE(r, MAP_FAILED) << std::strerror(errno);
  EXPECT_NE(::mprotect(r, bytes, PROT_READ | PROT_WRITE), 0)
      << "mprotect(PROT_WRITE) of the receiver's read-only mapping succeeded";
  ::munmap(r, bytes);

  // Reopening the memfd read-write through /proc does not help: the seal holds.
  const std::string self = "/proc/self/fd/" + std::to_string(ring.get());
  ScopedFd rw(::open(self.c_str(), O_RDWR | O_CLOEXEC));
  if (rw.valid()) {
    void* w2 = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, rw.get(), 0);
    EXPECT_EQ(w2, MAP_FAILED) << "a reopened fd maps the ring writable";
    if (w2 != MAP_FAILED) ::munmap(w2, bytes);
    const char byte = 1;
    EXPECT_LT(::pwrite(rw.get(), &byte, 1, 0), 0) << "a reopened fd writes the ring";
    EXPECT_NE(::fallocate(rw.get(), FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, 4096), 0)
        << "a reopened fd punches a hole in the ring";
  }
  EXPECT_NE(::fcntl(ring.get(), F_GET_SEALS) & F_SEAL_FUTURE_WRITE, 0);
}

// Receives one round of small_model() and checks every byte against seed `seed`.
Status receive_and_check(const std::string& address, std::uint32_t id, std::uint64_t seed) {
  auto r = Receiver::connect(address, id, tiny_options());
  if (!r.ok()) return r.status();
  Status bad;
  const auto want = make_weights(small_model(), seed);
  auto got = (*r)->receive_round([&](const TensorView& t) -> Status {
    for (std::size_t i = 0; i < want.specs.size(); ++i) {
      if (want.specs[i].name == t.spec.name &&
          (t.data.size() != want.data[i].size() ||
           (!t.data.empty() &&  // memcmp's pointers must not be null, even for 0 bytes
            std::memcmp(t.data.data(), want.data[i].data(), t.data.size()) != 0))) {
        bad = corruption(t.spec.name + " differs");
      }
    }
    return ok_status();
  });
  if (!got.ok()) return got.status();
  return bad;
}

TEST(ShmPeers, PeerOfAnotherUserIsDroppedAndTheRoundCompletes) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root, to run a peer as another uid (65534)";
  const std::string address = unique_address();
  auto sender = Sender::create(address, tiny_options());
  ASSERT_OK(sender);
  const pid_t intruder = ferry::testing::connect_as_another_user(address, SOCK_SEQPACKET);
  ASSERT_GT(intruder, 0) << "could not connect as uid 65534";
  Status received;
  std::thread rx([&] { received = receive_and_check(address, 1, 7); });
  Status accepted = (*sender)->accept(1);
  EXPECT_OK(accepted);
  if (accepted.ok()) {
    const auto w = make_weights(small_model(), 7);
    auto views = w.views();
    auto stats = (*sender)->send_round(views);
    EXPECT_OK(stats);
  }
  rx.join();
  EXPECT_OK(received);
  ::kill(intruder, SIGKILL);
  ::waitpid(intruder, nullptr, 0);
}

TEST(ShmPeers, SilentPeerDoesNotBlockAReceiverThatJoinsAfterIt) {
  const std::string address = unique_address();
  auto sender = Sender::create(address, tiny_options());
  ASSERT_OK(sender);
  // Connected first, never says HELLO; held open for the whole test.
  auto silent = shm::connect(address, milliseconds(5000));
  ASSERT_OK(silent);
  Status received;
  std::thread rx([&] { received = receive_and_check(address, 1, 9); });
  Status accepted = (*sender)->accept(1);
  EXPECT_OK(accepted);
  if (accepted.ok()) {
    EXPECT_EQ((*sender)->receivers(), 1u);
    const auto w = make_weights(small_model(), 9);
    auto views = w.views();
    auto stats = (*sender)->send_round(views);
    EXPECT_OK(stats);
  }
  rx.join();
  EXPECT_OK(received);
}

TEST(ShmPeers, SilentPeerIsDroppedAtItsOwnDeadline) {
  const std::string address = unique_address();
  SyncOptions o = tiny_options();
  o.timeout = milliseconds(300);
  auto sender = Sender::create(address, o);
  ASSERT_OK(sender);
  auto silent = shm::connect(address, milliseconds(5000));
  ASSERT_OK(silent);
  // It has its own 300 ms from when it was accepted; two waits outlast that.
  for (int i = 0; i < 2; ++i) {
    Status accepted = (*sender)->accept(1);
    EXPECT_EQ(accepted.code(), Code::kTimeout) << accepted.to_string();
  }
  // Dropped: the sender closed its end, which the silent peer sees as EOF.
  auto got = silent->receive(milliseconds(2000));
  EXPECT_EQ(got.status().code(), Code::kAborted) << got.status().to_string();
}

// A session that waits for two receivers and sees one says how many joined and which, not
// "no receiver joined" (a user then looks for the missing rank, not at the sender).
TEST(ShmPeers, AcceptTimeoutNamesTheReceiversThatJoined) {
  const std::string address = unique_address();
  SyncOptions o = tiny_options();
  o.timeout = milliseconds(400);
  auto sender = Sender::create(address, o);
  ASSERT_OK(sender);
  // Joining waits for the sender's WELCOME, so it runs beside accept().
  Status joined;
  std::unique_ptr<Receiver> receiver;
  std::thread rx([&] {
    auto r = Receiver::connect(address, 0, tiny_options());
    joined = r.status();
    if (r.ok()) receiver = std::move(*r);
  });
  Status accepted = (*sender)->accept(2);
  rx.join();
  EXPECT_OK(joined);
  EXPECT_EQ(accepted.code(), Code::kTimeout) << accepted.to_string();
  EXPECT_THAT(accepted.message(), ::testing::HasSubstr("only 1 of 2 receivers joined"));
  EXPECT_THAT(accepted.message(), ::testing::HasSubstr("receiver 0"));
}

// A receiver that joined and left before the first round (a verl rank whose join of another
// sender failed, trying again) neither counts as joined nor keeps its id: whether it comes
// back before or after the other receiver joins, the session serves the two that are there.
TEST(ShmPeers, AReceiverThatLeftBeforeTheFirstRoundMayJoinAgain) {
  for (const bool other_first : {false, true}) {
    SCOPED_TRACE(other_first ? "the other receiver joins in between" : "it comes back first");
    const std::string address = unique_address();
    auto sender = Sender::create(address, tiny_options());
    ASSERT_OK(sender);
    Status served;
    std::thread serve([&] {
      served = (*sender)->accept(2);
      if (!served.ok()) return;
      const auto w = make_weights(small_model(), 5);
      auto views = w.views();
      served = (*sender)->send_round(views).status();
    });
    Status left = Receiver::connect(address, 0, tiny_options()).status();  // joins, leaves
    Status other;
    std::thread rx([&] { other = receive_and_check(address, 1, 5); });
    // Either order passes; this one lets receiver 1 join first (most of the time).
    if (other_first) std::this_thread::sleep_for(milliseconds(200));
    Status again = receive_and_check(address, 0, 5);
    rx.join();
    serve.join();
    EXPECT_OK(left);
    EXPECT_OK(again);
    EXPECT_OK(other);
    EXPECT_OK(served);
  }
}

}  // namespace
}  // namespace ferry::sync
