// Delta rounds end to end (docs/delta.md, "Delta rounds"): every receive mode bit-exact over
// many sparse and dense updates, late joiners, corrupted deltas, a wrong base, a changed
// destination, a receiver killed mid-round, and a relay carrying the encoded bytes once.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <xxhash.h>

#include <cstdlib>
#include <map>
#include <random>
#include <thread>

#include "base/status_macros.h"
#include "codec/testing.h"
#include "delta/training_update.h"
#include "support/status_matchers.h"
#include "support/test_support.h"
#include "sync/net_test_util.h"
#include "sync/sync_test_util.h"
#include "sync/testing.h"

namespace ferry::sync {
namespace {

using testing::make_weights;
using testing::unique_address;
using testing::Weights;
using testing::write_token;

// Mixed dtypes and sizes; "embed" spans many buckets of delta_options().
std::vector<TensorSpec> delta_model() {
  return {*TensorSpec::make("embed", DType::kBF16, {96, 320}),  // 60 KiB
          *TensorSpec::make("norm", DType::kF32, {37}),
          *TensorSpec::make("bias", DType::kF16, {3}),
          *TensorSpec::make("packed", DType::kF4, {10}),
          *TensorSpec::make("empty", DType::kF32, {0}),
          *TensorSpec::make("proj", DType::kBF16, {64, 65}),
          *TensorSpec::make("head", DType::kF32, {40, 33})};
}

SyncOptions delta_options(DeltaMode mode = DeltaMode::kOn) {
  SyncOptions o;
  o.bucket_bytes = 8 << 10;
  o.slots = 2;
  o.timeout = std::chrono::milliseconds(10'000);
  o.delta = mode;
  o.delta_threads = 2;
  return o;
}

std::size_t element_bytes(DType dtype) {
  const int bits = dtype_bits(dtype);
  return bits >= 8 ? static_cast<std::size_t>(bits / 8) : 1;
}

// Changes a `density` fraction of every tensor's elements.
void update(Weights& w, std::uint64_t seed, double density) {
  for (std::size_t i = 0; i < w.specs.size(); ++i) {
    delta::change_elements(seed * 131 + i, density, element_bytes(w.specs[i].dtype), w.data[i]);
  }
}

std::uint64_t hash_all(const std::vector<std::vector<std::byte>>& tensors) {
  std::uint64_t h = 0;
  for (const auto& t : tensors) h = XXH3_64bits_withSeed(t.data(), t.size(), h);
  return h;
}

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

// What a callback-mode receiver saw, in manifest order.
std::vector<std::vector<std::byte>> in_order(const std::vector<TensorSpec>& specs,
                                             std::map<std::string, std::vector<std::byte>>& got) {
  std::vector<std::vector<std::byte>> v;
  for (const auto& s : specs) v.push_back(got[s.name]);
  return v;
}

enum class Mode { kDestination, kTensor, kBucket };

// Receives `rounds` rounds in `mode`; returns the hash of every tensor after each round.
std::vector<std::uint64_t> receive_rounds(Receiver& r, Mode mode, int rounds,
                                          const std::vector<TensorSpec>& specs,
                                          std::vector<bool>* delta_rounds = nullptr) {
  std::vector<std::uint64_t> hashes;
  Destination dst(specs);
  EXPECT_OK(dst.register_all(r));
  std::map<std::string, std::vector<std::byte>> got;
  for (int round = 0; round < rounds; ++round) {
    Result<RoundStats> stats = internal_error("unset");
    switch (mode) {
      case Mode::kDestination:
        stats = r.receive_round_into();
        break;
      case Mode::kTensor:
        stats = r.receive_round([&](const TensorView& t) {
          got[t.spec.name].assign(t.data.begin(), t.data.end());
          return ok_status();
        });
        break;
      case Mode::kBucket:
        stats = r.receive_round_buckets([&](std::span<const TensorView> ts, bool) {
          for (const auto& t : ts) got[t.spec.name].assign(t.data.begin(), t.data.end());
          return ok_status();
        });
        break;
    }
    EXPECT_OK(stats) << "round " << round;
    if (!stats.ok()) return hashes;
    if (delta_rounds != nullptr) delta_rounds->push_back(stats->delta);
    hashes.push_back(mode == Mode::kDestination ? hash_all(dst.data)
                                                : hash_all(in_order(specs, got)));
  }
  return hashes;
}

// After a failed session: the sender's next one starts dense, then sends a delta, and a
// receiver joining it in `mode` gets both bit-exact.
void expect_next_session_dense_then_delta(Sender& sender, Weights& w, const std::string& address,
                                          std::uint32_t receiver_id, const SyncOptions& o,
                                          Mode mode, std::uint64_t seed) {
  std::vector<std::uint64_t> got;
  std::vector<bool> was_delta;
  std::thread rx([&] {
    auto r = Receiver::connect(address, receiver_id, o);
    ASSERT_OK(r);
    got = receive_rounds(**r, mode, 2, delta_model(), &was_delta);
  });
  std::vector<std::uint64_t> want;
  Status sent = sender.accept(1);
  for (int i = 0; i < 2 && sent.ok(); ++i) {
    update(w, seed + i, 0.01);
    auto views = w.views();
    sent = sender.send_round(views).status();
    want.push_back(hash_all(w.data));
  }
  rx.join();
  EXPECT_OK(sent);
  EXPECT_EQ(got, want);
  EXPECT_EQ(was_delta, (std::vector<bool>{false, true}));
}

std::uint64_t test_seed() {
  const char* env = std::getenv("FERRY_DELTA_SEED");
  if (env != nullptr) return std::strtoull(env, nullptr, 10);
  return std::random_device{}();
}

// 50 steps of sparse, dense and Adam-like updates; every mode bit-exact after every step.
TEST(DeltaRound, FiftyRandomStepsBitExactInEveryMode) {
  const std::uint64_t seed = test_seed();
  SCOPED_TRACE("FERRY_DELTA_SEED=" + std::to_string(seed));
  constexpr int kSteps = 50;
  const std::string address = unique_address();
  auto sender = Sender::create(address, delta_options());
  ASSERT_OK(sender);
  std::vector<std::vector<std::uint64_t>> got(3);
  std::vector<std::thread> rx;
  for (int m = 0; m < 3; ++m) {
    rx.emplace_back([&, m] {
      auto r = Receiver::connect(address, static_cast<std::uint32_t>(m), delta_options());
      ASSERT_OK(r);
      got[m] = receive_rounds(**r, static_cast<Mode>(m), kSteps, delta_model());
    });
  }
  ASSERT_OK((*sender)->accept(3));
  std::mt19937_64 rng(seed);
  const double densities[] = {0.0, 0.001, 0.01, 0.1, 1.0};
  Weights w = make_weights(delta_model(), seed);
  std::vector<std::uint64_t> want;
  std::uint64_t delta_wire = 0, delta_dense = 0;
  for (int step = 0; step < kSteps; ++step) {
    if (step > 0) update(w, rng(), densities[rng() % 5]);
    auto views = w.views();
    auto stats = (*sender)->send_round(views);
    ASSERT_OK(stats) << "step " << step;
    EXPECT_EQ(stats->delta, step > 0) << "step " << step;
    EXPECT_EQ(stats->version, stats->round);
    if (stats->delta) {
      EXPECT_EQ(stats->base_version, stats->version - 1);
      delta_wire += stats->wire_bytes;
      delta_dense += stats->bytes;
    }
    want.push_back(hash_all(w.data));
  }
  for (auto& t : rx) t.join();
  for (int m = 0; m < 3; ++m) EXPECT_EQ(got[m], want) << "receive mode " << m;
  EXPECT_LT(delta_wire, delta_dense);  // most steps are sparse
}

// A receiver that joins mid-session gets a dense round, then deltas again.
TEST(DeltaRound, LateReceiverGetsADenseRoundThenDeltas) {
  const std::string address = unique_address();
  auto sender = Sender::create(address, delta_options());
  ASSERT_OK(sender);
  Weights w = make_weights(delta_model(), 3);
  std::vector<std::uint64_t> first, late;
  std::vector<bool> late_delta;
  std::thread a([&] {
    auto r = Receiver::connect(address, 0, delta_options());
    ASSERT_OK(r);
    first = receive_rounds(**r, Mode::kTensor, 4, delta_model());
  });
  ASSERT_OK((*sender)->accept(1));
  std::vector<std::uint64_t> want;
  std::vector<bool> sent_delta;
  auto send = [&](std::uint64_t seed) {
    if (seed > 0) update(w, seed, 0.01);
    auto views = w.views();
    auto stats = (*sender)->send_round(views);
    ASSERT_OK(stats);
    sent_delta.push_back(stats->delta);
    want.push_back(hash_all(w.data));
  };
  send(0);
  send(1);
  std::thread b([&] {
    auto r = Receiver::connect(address, 1, delta_options());
    ASSERT_OK(r);
    late = receive_rounds(**r, Mode::kDestination, 2, delta_model(), &late_delta);
  });
  ASSERT_OK((*sender)->accept(1));
  send(2);
  send(3);
  a.join();
  b.join();
  EXPECT_EQ(sent_delta, (std::vector<bool>{false, true, false, true}));
  EXPECT_EQ(late_delta, (std::vector<bool>{false, true}));
  EXPECT_EQ(first, want);
  EXPECT_EQ(late, std::vector<std::uint64_t>(want.begin() + 2, want.end()));
}

// Receives rounds into destinations until one fails; returns that error.
Status receive_until_error(const std::string& address, Destination* dst, int* rounds) {
  auto r = Receiver::connect(address, 0, delta_options());
  if (!r.ok()) return r.status();
  FERRY_RETURN_IF_ERROR(dst->register_all(**r));
  while (true) {
    auto stats = (*r)->receive_round_into();
    if (!stats.ok()) return stats.status();
    ++*rounds;
  }
}

// Sends a dense round and a delta round whose blob of "proj" was corrupted after encoding:
// the receiver refuses it naming the tensor; a new session is correct again.
TEST(DeltaRound, CorruptedDeltaIsNamedAndTheNextSessionIsCorrect) {
  const std::string address = unique_address();
  auto sender = Sender::create(address, delta_options());
  ASSERT_OK(sender);
  Weights w = make_weights(delta_model(), 5);
  Destination dst(delta_model());
  Status failed;
  int rounds = 0;
  std::thread rx([&] { failed = receive_until_error(address, &dst, &rounds); });
  ASSERT_OK((*sender)->accept(1));
  auto views = w.views();
  ASSERT_OK((*sender)->send_round(views));
  {
    codec::testing::ScopedCorruptDeltaHook hook(
        [](const std::string& tensor, std::vector<std::byte>* b) {
          if (tensor == "proj") (*b)[b->size() / 2] ^= std::byte{0x40};
        });
    update(w, 9, 0.01);
    views = w.views();
    EXPECT_FALSE((*sender)->send_round(views).ok());
  }
  rx.join();
  EXPECT_EQ(rounds, 1);
  EXPECT_EQ(failed.code(), Code::kCorruption) << failed.to_string();
  EXPECT_NE(failed.message().find("tensor 'proj'"), std::string::npos) << failed.message();
  expect_next_session_dense_then_delta(**sender, w, address, 0, delta_options(), Mode::kDestination,
                                       20);
}

// A delta naming a base the receiver does not hold is refused, naming both versions.
TEST(DeltaRound, DeltaFromAnotherBaseIsRefused) {
  const std::string address = unique_address();
  auto sender = Sender::create(address, delta_options());
  ASSERT_OK(sender);
  Weights w = make_weights(delta_model(), 6);
  Destination dst(delta_model());
  Status failed;
  int rounds = 0;
  std::thread rx([&] { failed = receive_until_error(address, &dst, &rounds); });
  ASSERT_OK((*sender)->accept(1));
  auto views = w.views();
  ASSERT_OK((*sender)->send_round(views));
  update(w, 1, 0.01);
  views = w.views();
  ASSERT_OK((*sender)->send_round(views));
  {
    codec::testing::ScopedSkewDeltaBaseHook hook([](std::uint64_t base) { return base - 1; });
    update(w, 2, 0.01);
    views = w.views();
    EXPECT_FALSE((*sender)->send_round(views).ok());
  }
  rx.join();
  EXPECT_EQ(failed.code(), Code::kFailedPrecondition) << failed.to_string();
  EXPECT_EQ(rounds, 2);
  EXPECT_NE(failed.message().find("delta from version 1 to 3, but this receiver holds version 2"),
            std::string::npos)
      << failed.message();
}

// A destination changed between rounds no longer holds the base: the resulting hash
// differs from the sender's and the round fails naming the tensor.
TEST(DeltaRound, DestinationChangedBetweenRoundsIsCaught) {
  const std::string address = unique_address();
  auto sender = Sender::create(address, delta_options());
  ASSERT_OK(sender);
  Weights w = make_weights(delta_model(), 8);
  Destination dst(delta_model());
  Status second;
  std::thread rx([&] {
    auto r = Receiver::connect(address, 0, delta_options());
    ASSERT_OK(r);
    ASSERT_OK(dst.register_all(**r));
    ASSERT_OK((*r)->receive_round_into());
    dst.data[6][100] ^= std::byte{1};  // "head", which the next update leaves alone
    second = (*r)->receive_round_into().status();
  });
  ASSERT_OK((*sender)->accept(1));
  auto views = w.views();
  ASSERT_OK((*sender)->send_round(views));
  delta::change_elements(2, 0.01, 2, w.data[0]);
  views = w.views();
  EXPECT_FALSE((*sender)->send_round(views).ok());
  rx.join();
  EXPECT_EQ(second.code(), Code::kCorruption) << second.to_string();
  EXPECT_NE(second.message().find("tensor 'head'"), std::string::npos) << second.message();
}

// Runs `body` in a child process and returns its pid; the child exits with body's result.
template <typename F>
pid_t spawn(F body) {
  const pid_t pid = ::fork();
  if (pid == 0) ::_exit(body());
  return pid;
}

int wait_exit(pid_t pid) {
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// A receiver killed in the middle of a delta round: the round fails, and the next session's
// rounds (dense, then delta) are correct.
TEST(DeltaRound, ReceiverKilledMidDeltaRoundThenNextRoundsAreCorrect) {
  const std::string address = unique_address();
  SyncOptions o = delta_options();
  o.timeout = std::chrono::milliseconds(5000);
  auto sender = Sender::create(address, o);
  ASSERT_OK(sender);
  const pid_t kid = spawn([&] {
    auto r = Receiver::connect(address, 4, o);
    if (!r.ok()) return 10;
    int buckets = 0;
    auto on_bucket = [&](std::span<const TensorView>, bool) {
      if (++buckets == 2) ::kill(::getpid(), SIGKILL);
      return ok_status();
    };
    auto first = (*r)->receive_round([](const TensorView&) { return ok_status(); });
    if (!first.ok()) return 11;
    (void)(*r)->receive_round_buckets(on_bucket);
    return 0;
  });
  ASSERT_OK((*sender)->accept(1));
  Weights w = make_weights(delta_model(), 4);
  auto views = w.views();
  ASSERT_OK((*sender)->send_round(views));
  // A dense update: the delta round spans several buckets.
  update(w, 1, 1.0);
  views = w.views();
  auto killed = (*sender)->send_round(views);
  ASSERT_FALSE(killed.ok());
  EXPECT_EQ(wait_exit(kid), 128 + SIGKILL);
  expect_next_session_dense_then_delta(**sender, w, address, 4, o, Mode::kBucket, 30);
}

// kAuto with a peer over the network sends deltas, but a round whose delta would be nearly
// as large as the weights goes dense.
TEST(DeltaRound, AutoGoesDenseWhenEverythingChanged) {
  ferry::testing::TempDir dir;
  SyncOptions o = delta_options(DeltaMode::kAuto);
  o.token_file = write_token(dir);
  auto sender = Sender::create("127.0.0.1:0", o);
  ASSERT_OK(sender);
  std::vector<std::uint64_t> got;
  std::thread rx([&] {
    auto r = Receiver::connect((*sender)->address(), 0, o);
    ASSERT_OK(r);
    got = receive_rounds(**r, Mode::kDestination, 7, delta_model());
  });
  ASSERT_OK((*sender)->accept(1));
  Weights w = make_weights(delta_model(), 2);
  std::vector<bool> sent_delta;
  std::vector<std::uint64_t> want;
  for (double density : {0.0, 1.0, 0.01, 1.0, 1.0, 0.04, 0.001}) {
    if (density > 0) update(w, sent_delta.size() + 1, density);
    auto views = w.views();
    auto stats = (*sender)->send_round(views);
    ASSERT_OK(stats);
    sent_delta.push_back(stats->delta);
    want.push_back(hash_all(w.data));
  }
  rx.join();
  EXPECT_EQ(sent_delta, (std::vector<bool>{false, false, true, false, false, true, true}));
  EXPECT_EQ(got, want);
}

// kAuto on shm alone sends every round dense, however little changed: a dense round is one
// copy into the ring, cheaper than a delta's encode, apply and hashes. Its BEGINs do not ask
// receivers to keep copies, so a callback-mode receiver with no room for them receives.
TEST(DeltaRound, AutoSendsDenseRoundsWhenEveryPeerSharesMemory) {
  const std::string address = unique_address();
  auto sender = Sender::create(address, delta_options(DeltaMode::kAuto));
  ASSERT_OK(sender);
  constexpr int kRounds = 4;
  std::vector<std::vector<std::uint64_t>> got(2);
  std::vector<std::vector<bool>> received_delta(2);
  std::vector<std::thread> rx;
  for (int m = 0; m < 2; ++m) {
    rx.emplace_back([&, m] {
      SyncOptions o = delta_options();
      o.delta_keep_limit = 0;
      auto r = Receiver::connect(address, static_cast<std::uint32_t>(m), o);
      ASSERT_OK(r);
      got[m] = receive_rounds(**r, m == 0 ? Mode::kDestination : Mode::kBucket, kRounds,
                              delta_model(), &received_delta[m]);
    });
  }
  ASSERT_OK((*sender)->accept(2));
  Weights w = make_weights(delta_model(), 5);
  std::vector<std::uint64_t> want;
  for (int round = 0; round < kRounds; ++round) {
    if (round > 0) update(w, round, round == 1 ? 0.001 : 0.01);
    auto views = w.views();
    auto stats = (*sender)->send_round(views);
    ASSERT_OK(stats);
    EXPECT_FALSE(stats->delta) << "round " << round;
    EXPECT_EQ(stats->wire_bytes, stats->bytes) << "round " << round;
    want.push_back(hash_all(w.data));
  }
  for (auto& t : rx) t.join();
  for (int m = 0; m < 2; ++m) {
    EXPECT_EQ(got[m], want) << "receiver " << m;
    EXPECT_EQ(received_delta[m], std::vector<bool>(kRounds, false)) << "receiver " << m;
  }
}

// A snapshot limit leaves later tensors without a base: they go dense-encoded inside delta
// rounds, and every round is still bit-exact.
TEST(DeltaRound, SnapshotLimitSendsTensorsPastItDense) {
  const std::string address = unique_address();
  SyncOptions o = delta_options();
  o.delta_snapshot_limit = delta_model()[0].bytes();  // "embed" only
  auto sender = Sender::create(address, o);
  ASSERT_OK(sender);
  std::vector<std::uint64_t> got;
  std::thread rx([&] {
    auto r = Receiver::connect(address, 0, o);
    ASSERT_OK(r);
    got = receive_rounds(**r, Mode::kBucket, 3, delta_model());
  });
  ASSERT_OK((*sender)->accept(1));
  Weights w = make_weights(delta_model(), 12);
  std::uint64_t rest = 0;  // bytes of the tensors past the limit
  for (std::size_t i = 1; i < w.specs.size(); ++i) rest += w.specs[i].bytes();
  std::vector<std::uint64_t> want;
  for (int round = 0; round < 3; ++round) {
    if (round > 0) update(w, round, 0.001);
    auto views = w.views();
    auto stats = (*sender)->send_round(views);
    ASSERT_OK(stats);
    want.push_back(hash_all(w.data));
    if (round > 0) {
      EXPECT_TRUE(stats->delta);
      EXPECT_GT(stats->wire_bytes, rest);  // those went whole
      EXPECT_LT(stats->wire_bytes, rest + w.specs[0].bytes() / 10);
    }
  }
  rx.join();
  EXPECT_EQ(got, want);
}

// Through a relay with two local receivers: bit-exact, and the delta round crosses the
// network once, as its encoded bytes.
TEST(DeltaRound, RelayForwardsTheEncodedBytesOnce) {
  ferry::testing::TempDir dir;
  SyncOptions o = delta_options();
  o.token_file = write_token(dir);
  auto sender = Sender::create("127.0.0.1:0", o);
  ASSERT_OK(sender);
  constexpr int kRounds = 3;
  const std::string local = unique_address();
  std::vector<RoundStats> relayed;
  std::vector<std::vector<std::uint64_t>> got(2);
  std::vector<std::thread> threads;
  threads.emplace_back([&] {
    auto relay = Relay::connect((*sender)->address(), 0, local, o);
    ASSERT_OK(relay);
    ASSERT_OK((*relay)->accept(2));
    for (int r = 0; r < kRounds; ++r) {
      auto stats = (*relay)->relay_round();
      ASSERT_OK(stats);
      relayed.push_back(*stats);
    }
  });
  for (int i = 0; i < 2; ++i) {
    threads.emplace_back([&, i] {
      auto r = Receiver::connect(local, static_cast<std::uint32_t>(i), o);
      ASSERT_OK(r);
      got[i] =
          receive_rounds(**r, i == 0 ? Mode::kDestination : Mode::kBucket, kRounds, delta_model());
    });
  }
  ASSERT_OK((*sender)->accept(1));
  Weights w = make_weights(delta_model(), 11);
  std::vector<RoundStats> sent;
  std::vector<std::uint64_t> want;
  for (int round = 0; round < kRounds; ++round) {
    if (round > 0) update(w, round, 0.01);
    auto views = w.views();
    auto stats = (*sender)->send_round(views);
    ASSERT_OK(stats);
    sent.push_back(*stats);
    want.push_back(hash_all(w.data));
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(got[0], want);
  EXPECT_EQ(got[1], want);
  ASSERT_EQ(relayed.size(), sent.size());
  for (int round = 1; round < kRounds; ++round) {
    EXPECT_TRUE(sent[round].delta);
    // What crossed the network to the node: the encoded bytes, a fraction of the weights.
    EXPECT_EQ(relayed[round].bytes, sent[round].wire_bytes);
    EXPECT_LT(sent[round].wire_bytes * 5, sent[round].bytes);
  }
}

}  // namespace
}  // namespace ferry::sync
