// Sender and Receiver end to end: delivery modes, N receivers in other processes,
// and failures made by really killing, stopping or corrupting a peer.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <map>
#include <thread>

#include "base/clock.h"
#include "support/status_matchers.h"
#include "support/test_support.h"
#include "sync/sync_test_util.h"
#include "sync/testing.h"
#include "transport/shm/seqpacket_channel.h"
#include "wire/message.h"

namespace ferry::sync {
namespace {

using testing::make_weights;
using testing::small_model;
using testing::tiny_options;
using testing::unique_address;
using testing::Weights;

struct Destination {
  std::vector<TensorSpec> specs;
  std::vector<std::vector<std::byte>> data;
  explicit Destination(const std::vector<TensorSpec>& s) : specs(s) {
    for (const auto& t : s) data.emplace_back(t.bytes(), std::byte{0x5a});
  }
  Status register_all(Receiver& r) {
    for (std::size_t i = 0; i < specs.size(); ++i) {
      Status s = r.set_destination({specs[i], data[i]});
      if (!s.ok()) return s;
    }
    return ok_status();
  }
};

void collect_bucket(std::span<const TensorView> ts,
                    std::map<std::string, std::vector<std::byte>>& into) {
  for (const auto& t : ts) {
    EXPECT_EQ(into.count(t.spec.name), 0u) << "delivered twice: " << t.spec.name;
    into[t.spec.name].assign(t.data.begin(), t.data.end());
  }
}

std::unique_ptr<Sender> make_sender(const std::string& address, const SyncOptions& o) {
  auto s = Sender::create(address, o);
  EXPECT_OK(s);
  return s.ok() ? std::move(*s) : nullptr;
}

TEST(Sync, DestinationModeAcrossRoundsInOneSession) {
  const std::string address = unique_address();
  auto sender = make_sender(address, tiny_options());
  ASSERT_NE(sender, nullptr);
  Destination dst(small_model());
  std::thread rx([&] {
    auto r = Receiver::connect(address, 0, tiny_options());
    ASSERT_OK(r);
    ASSERT_OK(dst.register_all(**r));
    for (int round = 1; round <= 3; ++round) {
      auto stats = (*r)->receive_round_into();
      ASSERT_OK(stats);
      EXPECT_EQ(stats->round, static_cast<std::uint64_t>(round));
    }
  });
  ASSERT_OK(sender->accept(1));
  for (std::uint64_t round = 1; round <= 3; ++round) {
    Weights w = make_weights(small_model(), round);
    auto views = w.views();
    auto stats = sender->send_round(views);
    ASSERT_OK(stats);
    EXPECT_GT(stats->buckets, 30u);
    EXPECT_EQ(stats->round, round);
    if (round == 3) {
      rx.join();
      for (std::size_t i = 0; i < w.specs.size(); ++i) {
        EXPECT_EQ(dst.data[i], w.data[i]) << w.specs[i].name;
      }
    }
  }
  if (rx.joinable()) rx.join();
}

TEST(Sync, PerTensorAndPerBucketCallbacks) {
  const std::string address = unique_address();
  SyncOptions o = tiny_options();
  o.slots = 3;
  auto sender = make_sender(address, o);
  ASSERT_NE(sender, nullptr);
  const Weights w = make_weights(small_model(), 7);
  std::map<std::string, std::vector<std::byte>> by_tensor, by_bucket;
  int last_flags = 0;
  std::thread rx([&] {
    auto r = Receiver::connect(address, 3, o);
    ASSERT_OK(r);
    auto s = (*r)->receive_round([&](const TensorView& t) {
      EXPECT_EQ(by_tensor.count(t.spec.name), 0u) << "delivered twice: " << t.spec.name;
      by_tensor[t.spec.name].assign(t.data.begin(), t.data.end());
      return ok_status();
    });
    ASSERT_OK(s);
    s = (*r)->receive_round_buckets([&](std::span<const TensorView> ts, bool is_last) {
      for (const auto& t : ts) by_bucket[t.spec.name].assign(t.data.begin(), t.data.end());
      last_flags += is_last ? 1 : 0;
      return ok_status();
    });
    ASSERT_OK(s);
  });
  ASSERT_OK(sender->accept(1));
  auto views = w.views();
  ASSERT_OK(sender->send_round(views));
  ASSERT_OK(sender->send_round(views));
  rx.join();
  EXPECT_EQ(last_flags, 1);
  for (std::size_t i = 0; i < w.specs.size(); ++i) {
    EXPECT_EQ(by_tensor[w.specs[i].name], w.data[i]) << w.specs[i].name;
    EXPECT_EQ(by_bucket[w.specs[i].name], w.data[i]) << w.specs[i].name;
  }
}

// Regression: in bucket mode a split tensor that ends in the bucket where the next split
// tensor starts was overwritten by the next one before the callback saw it.
TEST(Sync, BucketModeKeepsSplitTensorThatEndsWhereTheNextStarts) {
  const std::string address = unique_address();
  const SyncOptions o = tiny_options();  // 256-byte buckets
  auto sender = make_sender(address, o);
  ASSERT_NE(sender, nullptr);
  // a: buckets 0-1; b starts in bucket 1 right after a and runs into bucket 2.
  const Weights w = make_weights(
      {*TensorSpec::make("a", DType::kU8, {400}), *TensorSpec::make("b", DType::kU8, {400})}, 5);
  std::map<std::string, std::vector<std::byte>> got;
  std::thread rx([&] {
    auto r = Receiver::connect(address, 0, o);
    ASSERT_OK(r);
    auto s = (*r)->receive_round_buckets([&](std::span<const TensorView> ts, bool) {
      for (const auto& t : ts) got[t.spec.name].assign(t.data.begin(), t.data.end());
      return ok_status();
    });
    ASSERT_OK(s);
  });
  ASSERT_OK(sender->accept(1));
  auto views = w.views();
  ASSERT_OK(sender->send_round(views));
  rx.join();
  EXPECT_EQ(got["a"], w.data[0]);
  EXPECT_EQ(got["b"], w.data[1]);
}

// Buckets larger than a segment (16 MiB) are published in segments: tensors that span
// segments, buckets, or both arrive whole in every delivery mode.
TEST(Sync, BucketsLargerThanASegmentArriveWholeInEveryMode) {
  const std::string address = unique_address();
  SyncOptions o = tiny_options();
  o.bucket_bytes = 36ull << 20;  // segments of 16 + 16 + 4 MiB
  auto sender = make_sender(address, o);
  ASSERT_NE(sender, nullptr);
  const Weights w = make_weights({*TensorSpec::make("spans_segments", DType::kF32, {5u << 20}),
                                  *TensorSpec::make("small", DType::kBF16, {513}),
                                  *TensorSpec::make("empty", DType::kF16, {0}),
                                  *TensorSpec::make("spans_buckets", DType::kU8, {50u << 20}),
                                  *TensorSpec::make("tail", DType::kF64, {3u << 17})},
                                 11);
  Destination dst(w.specs);
  std::map<std::string, std::vector<std::byte>> by_tensor, by_bucket;
  std::thread rx([&] {
    auto r = Receiver::connect(address, 0, o);
    ASSERT_OK(r);
    ASSERT_OK(dst.register_all(**r));
    auto s = (*r)->receive_round_into().status();
    ASSERT_OK(s);
    s = (*r)->receive_round([&](const TensorView& t) {
              by_tensor[t.spec.name].assign(t.data.begin(), t.data.end());
              return ok_status();
            })
            .status();
    ASSERT_OK(s);
    s = (*r)->receive_round_buckets([&](std::span<const TensorView> ts, bool) {
              collect_bucket(ts, by_bucket);
              return ok_status();
            })
            .status();
    ASSERT_OK(s);
  });
  ASSERT_OK(sender->accept(1));
  auto views = w.views();
  for (int round = 0; round < 3; ++round) {
    auto stats = sender->send_round(views);
    ASSERT_OK(stats);
    EXPECT_EQ(stats->buckets, 3u);
  }
  rx.join();
  for (std::size_t i = 0; i < w.specs.size(); ++i) {
    EXPECT_TRUE(dst.data[i] == w.data[i]) << "destination " << w.specs[i].name;
    EXPECT_TRUE(by_tensor[w.specs[i].name] == w.data[i]) << "tensor callback " << w.specs[i].name;
    EXPECT_TRUE(by_bucket[w.specs[i].name] == w.data[i]) << "bucket callback " << w.specs[i].name;
  }
}

// Runs `body` in a child process and returns its pid; the child exits with body's result.
template <typename F>
pid_t spawn(F body) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    int rc = 99;
    rc = body();
    ::_exit(rc);
  }
  return pid;
}

int wait_exit(pid_t pid) {
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

TEST(Sync, TwoReceiverProcessesGetEveryByte) {
  const std::string address = unique_address();
  SyncOptions o = tiny_options();
  o.bucket_bytes = 64 * 1024;
  // One tensor of 1 MiB through a 64 KiB bucket, plus the small model.
  std::vector<TensorSpec> specs = small_model();
  specs.push_back(*TensorSpec::make("big", DType::kBF16, {512, 1024}));
  auto sender = make_sender(address, o);
  ASSERT_NE(sender, nullptr);
  std::vector<pid_t> kids;
  for (std::uint32_t id = 0; id < 2; ++id) {
    kids.push_back(spawn([&, id] {
      auto r = Receiver::connect(address, id, o);
      if (!r.ok()) return 10;
      Destination dst(specs);
      if (!dst.register_all(**r).ok()) return 11;
      for (std::uint64_t round = 1; round <= 3; ++round) {
        auto got = (*r)->receive_round_into();
        if (!got.ok()) {
          std::fprintf(stderr, "receiver %u: %s\n", id, got.status().to_string().c_str());
          return 12;
        }
        const Weights want = make_weights(specs, round * 10);
        for (std::size_t i = 0; i < specs.size(); ++i) {
          if (ferry::testing::hash_bytes(dst.data[i]) != ferry::testing::hash_bytes(want.data[i])) {
            std::fprintf(stderr, "receiver %u: round %llu tensor %s differs\n", id,
                         static_cast<unsigned long long>(round), specs[i].name.c_str());
            return 13;
          }
        }
      }
      return 0;
    }));
  }
  ASSERT_OK(sender->accept(2));
  EXPECT_EQ(sender->receivers(), 2u);
  for (std::uint64_t round = 1; round <= 3; ++round) {
    const Weights w = make_weights(specs, round * 10);
    auto views = w.views();
    auto stats = sender->send_round(views);
    ASSERT_OK(stats);
  }
  for (pid_t k : kids) EXPECT_EQ(wait_exit(k), 0);
}

TEST(SyncFailure, ReceiverKilledMidRoundFailsTheSenderNamingIt) {
  const std::string address = unique_address();
  SyncOptions o = tiny_options();
  o.timeout = std::chrono::milliseconds(5000);
  auto sender = make_sender(address, o);
  ASSERT_NE(sender, nullptr);
  const pid_t kid = spawn([&] {
    auto r = Receiver::connect(address, 4, o);
    if (!r.ok()) return 10;
    int buckets = 0;
    (void)(*r)->receive_round_buckets([&](std::span<const TensorView>, bool) {
      if (++buckets == 3) ::kill(::getpid(), SIGKILL);
      return ok_status();
    });
    return 0;
  });
  ASSERT_OK(sender->accept(1));
  const Weights w = make_weights(small_model(), 1);
  auto views = w.views();
  const auto start = Clock::now();
  auto stats = sender->send_round(views);
  const auto took = Clock::now() - start;
  ASSERT_FALSE(stats.ok());
  EXPECT_EQ(stats.status().code(), Code::kAborted) << stats.status().to_string();
  EXPECT_NE(stats.status().message().find("receiver 4"), std::string::npos)
      << stats.status().message();
  EXPECT_NE(stats.status().message().find("round 1"), std::string::npos)
      << stats.status().message();
  EXPECT_LT(took, o.timeout);
  EXPECT_EQ(wait_exit(kid), 128 + SIGKILL);
  // The session is broken and says why.
  EXPECT_EQ(sender->send_round(views).status().code(), Code::kFailedPrecondition);
  // The receiver comes back: the same Sender's next accept() starts a new session on the
  // same address and ring, and the next round reaches it.
  const std::uint64_t old_session = sender->session_id();
  Destination dst(small_model());
  Status again;
  std::thread rx([&] {
    auto r = Receiver::connect(address, 4, o);
    ASSERT_OK(r);
    ASSERT_OK(dst.register_all(**r));
    again = (*r)->receive_round_into().status();
  });
  ASSERT_OK(sender->accept(1));
  EXPECT_NE(sender->session_id(), old_session);
  auto next = sender->send_round(views);
  rx.join();
  ASSERT_OK(next);
  EXPECT_OK(again);
  for (std::size_t i = 0; i < w.specs.size(); ++i) EXPECT_EQ(dst.data[i], w.data[i]);
}

TEST(SyncFailure, StoppedReceiverTimesOutNamingIt) {
  const std::string address = unique_address();
  SyncOptions o = tiny_options();
  o.timeout = std::chrono::milliseconds(300);
  auto sender = make_sender(address, o);
  ASSERT_NE(sender, nullptr);
  const pid_t kid = spawn([&] {
    SyncOptions ro = o;
    ro.timeout = std::chrono::milliseconds(10'000);
    auto r = Receiver::connect(address, 5, ro);
    if (!r.ok()) return 10;
    (void)(*r)->receive_round_buckets([&](std::span<const TensorView>, bool) {
      ::raise(SIGSTOP);  // alive but silent: only the timeout can tell
      return ok_status();
    });
    return 0;
  });
  ASSERT_OK(sender->accept(1));
  const Weights w = make_weights(small_model(), 1);
  auto views = w.views();
  auto stats = sender->send_round(views);
  ::kill(kid, SIGKILL);
  wait_exit(kid);
  ASSERT_FALSE(stats.ok());
  EXPECT_EQ(stats.status().code(), Code::kTimeout) << stats.status().to_string();
  EXPECT_NE(stats.status().message().find("receiver 5"), std::string::npos);
  EXPECT_NE(stats.status().message().find("round 1"), std::string::npos);
}

TEST(SyncFailure, SenderKilledAbortsTheReceiverAtOnce) {
  const std::string address = unique_address();
  SyncOptions o = tiny_options();
  o.timeout = std::chrono::milliseconds(30'000);  // EOF must win long before this
  const pid_t kid = spawn([&] {
    auto s = Sender::create(address, o);
    if (!s.ok()) return 10;
    if (!(*s)->accept(1).ok()) return 11;
    testing::ScopedCorruptSlotHook kill_at_bucket_5([](std::uint32_t bucket, std::byte*) {
      if (bucket == 5) ::kill(::getpid(), SIGKILL);
    });
    const Weights w = make_weights(small_model(), 1);
    auto views = w.views();
    (void)(*s)->send_round(views);
    return 12;
  });
  auto r = Receiver::connect(address, 0, o);
  ASSERT_OK(r);
  Destination dst(small_model());
  ASSERT_OK(dst.register_all(**r));
  const auto start = Clock::now();
  auto stats = (*r)->receive_round_into();
  const auto took = Clock::now() - start;
  ASSERT_FALSE(stats.ok());
  EXPECT_EQ(stats.status().code(), Code::kAborted) << stats.status().to_string();
  EXPECT_NE(stats.status().message().find("round 1 aborted"), std::string::npos)
      << stats.status().message();
  EXPECT_LT(took, std::chrono::seconds(5));
  EXPECT_EQ(wait_exit(kid), 128 + SIGKILL);
}

TEST(SyncFailure, ReceiverOfAStaleSessionIsTurnedAway) {
  const std::string address = unique_address();
  auto sender = make_sender(address, tiny_options());
  ASSERT_NE(sender, nullptr);
  Status accepted;
  std::thread tx([&] { accepted = sender->accept(1); });
  auto stale = Receiver::connect(address, 1, tiny_options(), sender->session_id() ^ 1);
  ASSERT_FALSE(stale.ok());
  EXPECT_EQ(stale.status().code(), Code::kFailedPrecondition) << stale.status().to_string();
  EXPECT_NE(stale.status().message().find("stale session"), std::string::npos);
  auto good = Receiver::connect(address, 1, tiny_options(), sender->session_id());
  ASSERT_OK(good);
  tx.join();
  EXPECT_OK(accepted);
  EXPECT_EQ(sender->receivers(), 1u);
  EXPECT_EQ((*good)->session_id(), sender->session_id());
}

TEST(SyncFailure, ReleaseOfAStaleRoundIsRejected) {
  // A hand-written peer that answers round 1's first bucket with a RELEASE for round 0.
  const std::string address = unique_address();
  auto sender = make_sender(address, tiny_options());
  ASSERT_NE(sender, nullptr);
  std::thread fake([&] {
    auto ch = shm::connect(address, std::chrono::milliseconds(5000));
    ASSERT_OK(ch);
    wire::Message hello;
    hello.body = wire::Hello{9, 1};
    ASSERT_OK(ch->send(wire::encode(hello), std::chrono::milliseconds(1000)));
    std::uint64_t session = 0;
    for (int i = 0; i < 3; ++i) {  // WELCOME, BEGIN, FILLED
      auto got = ch->receive(std::chrono::milliseconds(5000));
      ASSERT_OK(got);
      auto m = wire::decode(got->bytes, "sender");
      ASSERT_OK(m);
      session = m->session;
    }
    wire::Message stale;
    stale.session = session;
    stale.round = 0;
    stale.body = wire::Release{0, 0};
    ASSERT_OK(ch->send(wire::encode(stale), std::chrono::milliseconds(1000)));
    (void)ch->receive(std::chrono::milliseconds(5000));  // the sender's ERROR, or EOF
  });
  ASSERT_OK(sender->accept(1));
  const Weights w = make_weights(small_model(), 1);
  auto views = w.views();
  auto stats = sender->send_round(views);
  fake.join();
  ASSERT_FALSE(stats.ok());
  EXPECT_NE(stats.status().message().find("receiver 9"), std::string::npos)
      << stats.status().message();
  EXPECT_NE(stats.status().message().find("stale round"), std::string::npos)
      << stats.status().message();
}

TEST(SyncFailure, CorruptedSlotByteIsCaughtByTheChecksum) {
  const std::string address = unique_address();
  auto sender = make_sender(address, tiny_options());
  ASSERT_NE(sender, nullptr);
  testing::ScopedCorruptSlotHook flip_a_bit([](std::uint32_t bucket, std::byte* slot) {
    if (bucket == 2) slot[17] ^= std::byte{0x01};
  });
  Status received;
  Destination dst(small_model());
  std::thread rx([&] {
    auto r = Receiver::connect(address, 2, tiny_options());
    ASSERT_OK(r);
    ASSERT_OK(dst.register_all(**r));
    received = (*r)->receive_round_into().status();
  });
  ASSERT_OK(sender->accept(1));
  const Weights w = make_weights(small_model(), 1);
  auto views = w.views();
  auto stats = sender->send_round(views);
  rx.join();
  EXPECT_EQ(received.code(), Code::kCorruption) << received.to_string();
  EXPECT_NE(received.message().find("bucket 2"), std::string::npos) << received.message();
  ASSERT_FALSE(stats.ok());
  EXPECT_EQ(stats.status().code(), Code::kCorruption);
  EXPECT_NE(stats.status().message().find("receiver 2"), std::string::npos);
}

TEST(SyncFailure, DestinationMismatchListsEveryMismatch) {
  const std::string address = unique_address();
  auto sender = make_sender(address, tiny_options());
  ASSERT_NE(sender, nullptr);
  Status received;
  std::thread rx([&] {
    auto r = Receiver::connect(address, 0, tiny_options());
    ASSERT_OK(r);
    std::vector<TensorSpec> specs = small_model();
    specs[1].shape = {38};           // wrong shape
    specs[2].dtype = DType::kBF16;   // wrong dtype
    specs.erase(specs.begin() + 5);  // model.norm.weight missing
    Destination dst(specs);
    ASSERT_OK(dst.register_all(**r));
    received = (*r)->receive_round_into().status();
  });
  ASSERT_OK(sender->accept(1));
  const Weights w = make_weights(small_model(), 1);
  auto views = w.views();
  auto stats = sender->send_round(views);
  rx.join();
  EXPECT_EQ(received.code(), Code::kInvalidArgument);
  const std::string& m = received.message();
  EXPECT_NE(m.find("3 manifest mismatch"), std::string::npos) << m;
  EXPECT_NE(m.find("'model.layers.0.input_layernorm.weight': sender sends [37] BF16, destination "
                   "is [38] BF16"),
            std::string::npos)
      << m;
  EXPECT_NE(m.find("'model.layers.0.self_attn.q_proj.bias': sender sends [3] F16, destination is "
                   "[3] BF16"),
            std::string::npos)
      << m;
  EXPECT_NE(m.find("missing destination for 'model.norm.weight'"), std::string::npos) << m;
  ASSERT_FALSE(stats.ok());
  EXPECT_NE(stats.status().message().find("receiver 0"), std::string::npos);
}

TEST(SyncFailure, NoDescriptorLeaksAfterSessionsAndFailures) {
  const int before = testing::open_fd_count();
  for (int trial = 0; trial < 2; ++trial) {
    const std::string address = unique_address();
    auto sender = make_sender(address, tiny_options());
    ASSERT_NE(sender, nullptr);
    testing::ScopedCorruptSlotHook corrupt_in_trial_1([trial](std::uint32_t b, std::byte* slot) {
      if (trial == 1 && b == 1) slot[0] ^= std::byte{1};
    });
    std::thread rx([&] {
      auto r = Receiver::connect(address, 0, tiny_options());
      ASSERT_OK(r);
      (void)(*r)->receive_round([](const TensorView&) { return ok_status(); });
    });
    ASSERT_OK(sender->accept(1));
    const Weights w = make_weights(small_model(), 1);
    auto views = w.views();
    EXPECT_EQ(sender->send_round(views).ok(), trial == 0);
    rx.join();
  }
  EXPECT_EQ(testing::open_fd_count(), before);
}

TEST(Sync, FilesystemAddressIsPrivateAndRemoved) {
  ferry::testing::TempDir dir;
  const std::string path = dir.file("sync.sock");
  {
    auto sender = make_sender(path, tiny_options());
    ASSERT_NE(sender, nullptr);
    struct stat st {};
    ASSERT_EQ(::stat(path.c_str(), &st), 0);
    EXPECT_TRUE(S_ISSOCK(st.st_mode));
    EXPECT_EQ(st.st_mode & 0777, 0600u);
  }
  struct stat st {};
  EXPECT_NE(::stat(path.c_str(), &st), 0);
}

TEST(Sync, BadArgumentsAreRejected) {
  SyncOptions o = tiny_options();
  o.bucket_bytes = 100;
  EXPECT_EQ(Sender::create(unique_address(), o).status().code(), Code::kInvalidArgument);
  o = tiny_options();
  o.slots = 0;
  EXPECT_EQ(Sender::create(unique_address(), o).status().code(), Code::kInvalidArgument);
  auto sender = make_sender(unique_address(), tiny_options());
  ASSERT_NE(sender, nullptr);
  EXPECT_EQ(sender->send_round({}).status().code(), Code::kFailedPrecondition);
}

// Issue #15: no sender was IoError "Connection refused", and a sliced wait's timeout named
// its last slice ("within 14 ms" for a 3 s timeout). With and without an interrupt hook.
TEST(SyncFailure, WaitForAPeerTimesOutNamingAddressAndTimeout) {
  for (const bool hook : {false, true}) {
    SCOPED_TRACE(hook ? "with an interrupt hook" : "without");
    SyncOptions o = tiny_options();
    o.timeout = std::chrono::milliseconds(300);
    if (hook) o.interrupt = [] { return ok_status(); };
    const std::string address = unique_address();
    auto r = Receiver::connect(address, 0, o);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), Code::kTimeout) << r.status().to_string();
    EXPECT_NE(r.status().message().find(address), std::string::npos) << r.status().to_string();
    EXPECT_NE(r.status().message().find("within 300 ms"), std::string::npos)
        << r.status().to_string();
    auto sender = make_sender(address, o);
    ASSERT_NE(sender, nullptr);
    Status s = sender->accept(1);
    EXPECT_EQ(s.code(), Code::kTimeout) << s.to_string();
    EXPECT_NE(s.message().find("within 300 ms"), std::string::npos) << s.to_string();
  }
}

// A join retries a session that closes before its WELCOME, but not an interrupt (Ctrl-C in
// Python is a kAborted from the hook): that ends the join at once.
TEST(SyncFailure, AnInterruptWhileWaitingForWelcomeEndsTheJoinAtOnce) {
  const std::string address = unique_address();
  auto sender = make_sender(address, tiny_options());  // up, never in accept()
  ASSERT_NE(sender, nullptr);
  SyncOptions o = tiny_options();  // 10 s
  const auto start = Clock::now();
  bool fired = false;  // once, as Python's hook raises a pending KeyboardInterrupt once
  o.interrupt = [&] {
    if (fired || Clock::now() - start < std::chrono::milliseconds(300)) return ok_status();
    fired = true;
    return aborted("interrupted (test)");
  };
  auto r = Receiver::connect(address, 0, o);
  EXPECT_EQ(r.status().code(), Code::kAborted) << r.status().to_string();
  EXPECT_NE(r.status().message().find("interrupted (test)"), std::string::npos)
      << r.status().to_string();
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(5));
}

}  // namespace
}  // namespace ferry::sync
