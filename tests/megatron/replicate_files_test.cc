// Replication's file-set mode (ReplicateServeOptions::offer, ReplicatePullOptions::only): a
// server offering an arbitrary set of files, over each transport (replicate_wires.h), pullers
// on this thread checking them against the sizes and XXH3s they hold themselves.
#include "megatron/replicate_files.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <future>
#include <thread>

#include "base/clock.h"
#include "ferry/megatron.h"
#include "megatron/megatron_fixture.h"
#include "megatron/replicate_server_thread.h"
#include "megatron/replicate_wires.h"
#include "support/status_matchers.h"

namespace ferry::checkpoint {
namespace {

using std::chrono::milliseconds;
using test::Wire;
namespace fs = std::filesystem;

constexpr milliseconds kTimeout{10'000};

// Two nodes' folders: `src` offers files, `dst` fetches them.
struct Nodes {
  explicit Nodes(Wire w = Wire::kNet) : wire(w) {}
  testing::TempDir dir;
  std::string src = dir.file("src"), dst = dir.file("dst");
  std::string token = test::write_token(dir, "token", ::ferry::testing::kTestToken);
  Wire wire;  // what servers listen on: each at a fresh address

  // Writes `bytes` to `rel` below `src`; returns its entry as a caller would hold it.
  ReplicaFile add(const std::string& rel, const std::string& bytes) {
    test::put(src + "/" + rel, bytes);
    return {rel, bytes.size(), testing::hash_bytes(as_bytes(bytes))};
  }
  ReplicateServeOptions serve_options(std::vector<ReplicaFile> files) const {
    ReplicateServeOptions o{
        .root = src, .address = test::listen_address(wire), .token_file = token};
    o.offer = [files = std::move(files)]() -> Result<ReplicaSet> {
      ReplicaSet set;
      set.files = files;
      return set;
    };
    return o;
  }
  ReplicatePullOptions pull_options(const std::string& from, std::vector<ReplicaFile> only) const {
    ReplicatePullOptions o{.root = dst, .from = from, .token_file = token, .timeout = kTimeout};
    o.only = std::move(only);
    return o;
  }
};

bool has_temp_file(const std::string& root) {
  for (const std::string& f : test::tree(root)) {
    if (f.find(".tmp.") != std::string::npos) return true;
  }
  return false;
}

void expect_mentions(const Status& s, const std::vector<std::string>& words) {
  for (const std::string& w : words) {
    EXPECT_NE(s.message().find(w), std::string::npos) << "'" << w << "' in " << s.to_string();
  }
}

// The behaviours every transport must keep; each TEST_P runs over net and shm.
class ReplicateFiles : public ::testing::TestWithParam<Wire> {};
FERRY_REPLICATE_OVER_WIRES(ReplicateFiles);

TEST(ReplicateFilesXxh3, Xxh3FileMatchesXxh3OfTheBytes) {
  testing::TempDir dir;
  // Crosses the 8 MiB read size, so the streaming hash joins several reads.
  const std::string big = test::fake_bytes("", (9u << 20) + 17, 1);
  testing::write_bytes(dir.file("big"), big);
  testing::write_bytes(dir.file("empty"), "");
  auto h = xxh3_file(dir.file("big"));
  ASSERT_OK(h);
  EXPECT_EQ(*h, testing::hash_bytes(as_bytes(big)));
  h = xxh3_file(dir.file("empty"));
  ASSERT_OK(h);
  EXPECT_EQ(*h, testing::hash_bytes({}));
  h = xxh3_file(dir.file("absent"));
  ASSERT_FALSE(h.ok());
  EXPECT_EQ(h.status().code(), Code::kNotFound) << h.status().to_string();
  expect_mentions(h.status(), {dir.file("absent")});
}

TEST_P(ReplicateFiles, FetchesTheSetByteExactAndSkipsWhatIsThere) {
  Nodes t(GetParam());
  const std::string big = test::fake_bytes("", (5u << 20) + 123, 7);
  const std::vector<ReplicaFile> files = {
      t.add("__0_0.distcp", big),
      t.add("model/__1_0.distcp", test::fake_bytes("", 70'000, 8)),
      t.add("model/deeper/.metadata", "tiny"),
  };
  // Offered but not asked for: the puller takes only its set.
  const ReplicaFile extra = t.add("other.bin", "not wanted");
  auto offered = files;
  offered.push_back(extra);
  auto so = t.serve_options(offered);
  so.chunk_bytes = 256 << 10;  // the big file crosses many data messages
  ServerThread server(so);
  ASSERT_FALSE(server.address().empty());

  auto po = t.pull_options(server.address(), files);
  std::vector<PullRound> rounds;
  po.on_round = [&](const PullRound& r) { rounds.push_back(r); };
  std::uint64_t progress_done = 0, progress_total = 0;
  po.progress = [&](std::uint64_t done, std::uint64_t total) {
    EXPECT_GT(done, progress_done);
    progress_done = done;
    progress_total = total;
  };
  auto r = pull_replicas(po);
  ASSERT_OK(r);
  EXPECT_EQ(r->files_copied, 3u);
  EXPECT_EQ(r->bytes_copied, big.size() + 70'000 + 4);
  EXPECT_EQ(progress_done, r->bytes_copied);
  EXPECT_EQ(progress_total, r->bytes_copied);
  EXPECT_FALSE(r->tracker.has_value());
  ASSERT_EQ(rounds.size(), 1u);
  EXPECT_EQ(rounds[0].unchanged, 0u);
  for (const ReplicaFile& f : files) {
    EXPECT_EQ(test::slurp(t.dst + "/" + f.path), test::slurp(t.src + "/" + f.path)) << f.path;
    auto h = xxh3_file(t.dst + "/" + f.path);
    ASSERT_OK(h);
    EXPECT_EQ(*h, f.xxh3) << f.path;
  }
  EXPECT_FALSE(fs::exists(t.dst + "/other.bin"));
  EXPECT_FALSE(has_temp_file(t.dst));

  // Everything is there: nothing is fetched again.
  po.progress = {};
  rounds.clear();
  r = pull_replicas(po);
  ASSERT_OK(r);
  EXPECT_EQ(r->files_copied, 0u);
  EXPECT_EQ(r->bytes_copied, 0u);
  ASSERT_EQ(rounds.size(), 1u);
  EXPECT_EQ(rounds[0].unchanged, 3u);

  // A file gone or with other bytes of the same size here is fetched again; the rest is not.
  fs::remove(t.dst + "/model/__1_0.distcp");
  std::string stale = big;
  stale[4'000'000] ^= 0x20;
  testing::write_bytes(t.dst + "/__0_0.distcp", stale);
  rounds.clear();
  r = pull_replicas(po);
  ASSERT_OK(r);
  EXPECT_EQ(r->files_copied, 2u);
  ASSERT_EQ(rounds.size(), 1u);
  EXPECT_EQ(rounds[0].unchanged, 1u);
  EXPECT_EQ(test::slurp(t.dst + "/__0_0.distcp"), big);
  EXPECT_OK(server.stop());
}

TEST_P(ReplicateFiles, AnIndexClaimingAnotherXxh3IsRefusedAndNamed) {
  Nodes t(GetParam());
  const ReplicaFile good = t.add("shard.distcp", test::fake_bytes("", 5000, 2));
  ReplicaFile claimed = good;
  claimed.xxh3 ^= 1;  // the server claims other contents than the caller holds
  ServerThread server(t.serve_options({claimed}));
  auto r = pull_replicas(t.pull_options(server.address(), {good}));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kCorruption) << r.status().to_string();
  expect_mentions(r.status(), {server.address(), "shard.distcp", "caller expects"});
  EXPECT_TRUE(test::tree(t.dst).empty());

  // Another size: refused the same way.
  claimed = good;
  claimed.bytes += 1;
  ServerThread other(t.serve_options({claimed}));
  r = pull_replicas(t.pull_options(other.address(), {good}));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kCorruption) << r.status().to_string();
  expect_mentions(r.status(), {other.address(), "shard.distcp", "caller expects"});
}

TEST_P(ReplicateFiles, AServerFileChangedAfterTheOfferIsRefusedAndNothingIsLeft) {
  Nodes t(GetParam());
  const std::string bytes = test::fake_bytes("", 300'000, 3);
  const ReplicaFile f = t.add("ranks/__3_0.distcp", bytes);
  // The offer (and the caller) have the old contents; the server's disk now has others of
  // the same size.
  std::string flipped = bytes;
  flipped[123'456] ^= 0x01;
  testing::write_bytes(t.src + "/" + f.path, flipped);
  ServerThread server(t.serve_options({f}));
  auto r = pull_replicas(t.pull_options(server.address(), {f}));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kCorruption) << r.status().to_string();
  expect_mentions(r.status(), {server.address(), f.path});
  EXPECT_FALSE(fs::exists(t.dst + "/" + f.path));
  EXPECT_FALSE(has_temp_file(t.dst));
}

TEST_P(ReplicateFiles, BytesChangedWhileBeingSentAreDiscarded) {
  Nodes t(GetParam());
  const std::string bytes = test::fake_bytes("", 1u << 20, 4);
  const ReplicaFile f = t.add("__0_0.distcp", bytes);
  auto so = t.serve_options({f});
  so.chunk_bytes = 64 << 10;
  // After the first chunk went out, a byte further on changes on the server's disk (same
  // size): the server checked the file before FILE, so only the puller's hash sees it.
  std::atomic<bool> flipped{false};
  const std::string served = t.src + "/" + f.path;
  so.test_after_chunk = [&](const std::string&, std::uint64_t sent) {
    if (sent != so.chunk_bytes || flipped.exchange(true)) return;
    std::FILE* out = std::fopen(served.c_str(), "r+b");
    ASSERT_NE(out, nullptr);
    std::fseek(out, 900'000, SEEK_SET);
    std::fputc(bytes[900'000] ^ 0x40, out);
    std::fclose(out);
  };
  ServerThread server(so);
  auto r = pull_replicas(t.pull_options(server.address(), {f}));
  EXPECT_TRUE(flipped);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kCorruption) << r.status().to_string();
  expect_mentions(r.status(), {server.address(), f.path, "XXH3"});
  EXPECT_FALSE(fs::exists(t.dst + "/" + f.path));
  EXPECT_FALSE(has_temp_file(t.dst));
}

TEST_P(ReplicateFiles, AFileNotOfferedIsNotFoundAndNamed) {
  Nodes t(GetParam());
  const ReplicaFile there = t.add("a.distcp", "aaaa");
  ServerThread server(t.serve_options({there}));
  const ReplicaFile missing{"b/missing.distcp", 10, 42};
  auto r = pull_replicas(t.pull_options(server.address(), {there, missing}));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kNotFound) << r.status().to_string();
  expect_mentions(r.status(), {server.address(), missing.path});
  EXPECT_TRUE(test::tree(t.dst).empty());  // checked before anything is fetched
}

TEST_P(ReplicateFiles, AServerNotListeningIsNamedQuickly) {
  Nodes t(GetParam());
  const ReplicaFile f = t.add("a.distcp", "aaaa");
  std::string address;
  {
    ServerThread server(t.serve_options({f}));
    address = server.address();
  }  // stopped: nothing listens on its port now
  auto po = t.pull_options(address, {f});
  po.timeout = milliseconds(500);
  const auto start = Clock::now();
  auto r = pull_replicas(po);
  ASSERT_FALSE(r.ok());
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(5));
  expect_mentions(r.status(), {address});
  EXPECT_FALSE(fs::exists(t.dst + "/a.distcp"));
}

TEST(ReplicateFilesNet, WrongTokenIsRefused) {
  Nodes t;
  const ReplicaFile f = t.add("a.distcp", "aaaa");
  ServerThread server(t.serve_options({f}));
  auto po = t.pull_options(server.address(), {f});
  po.token_file = test::write_token(t.dir, "wrong", ::ferry::testing::kOtherTestToken);
  auto r = pull_replicas(po);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kUnauthenticated) << r.status().to_string();
  EXPECT_FALSE(fs::exists(t.dst + "/a.distcp"));
  // The server goes on serving pullers with the right token.
  EXPECT_OK(pull_replicas(t.pull_options(server.address(), {f})));
  EXPECT_EQ(test::slurp(t.dst + "/a.distcp"), "aaaa");
}

TEST_P(ReplicateFiles, TheServerReadsOnlyBeneathItsRootAndNeverThroughALink) {
  Nodes t(GetParam());
  testing::write_bytes(t.dir.file("secret"), "not for the network");
  fs::create_directories(t.dir.file("outside"));
  testing::write_bytes(t.dir.file("outside/f.distcp"), "outside!");
  fs::create_directories(t.src);
  fs::create_directory_symlink(t.dir.file("outside"), t.src + "/linked");
  const std::string outside = "outside!";
  const ReplicaFile via_link{"linked/f.distcp", outside.size(),
                             testing::hash_bytes(as_bytes(outside))};
  ServerThread server(t.serve_options({via_link}));
  auto r = pull_replicas(t.pull_options(server.address(), {via_link}));
  ASSERT_FALSE(r.ok());
  expect_mentions(r.status(), {server.address(), via_link.path});
  EXPECT_TRUE(test::tree(t.dst).empty());

  // An offer that names a path outside the root is not served at all.
  const std::string secret = "not for the network";
  const ReplicaFile escape{"../secret", secret.size(), testing::hash_bytes(as_bytes(secret))};
  ServerThread bad(t.serve_options({escape}));
  auto po = t.pull_options(bad.address(), {{"secret", escape.bytes, escape.xxh3}});
  r = pull_replicas(po);
  ASSERT_FALSE(r.ok());
  expect_mentions(r.status(), {"../secret"});
  EXPECT_TRUE(test::tree(t.dst).empty());
}

TEST(ReplicateFilesOptions, BadFileSetsAreClearErrors) {
  Nodes t;
  const ReplicaFile f{"a.distcp", 4, 1};
  auto po = t.pull_options("127.0.0.1:1", {f});
  po.watch = true;
  auto r = pull_replicas(po);
  EXPECT_EQ(r.status().code(), Code::kInvalidArgument) << r.status().to_string();
  for (const std::vector<ReplicaFile>& only :
       {std::vector<ReplicaFile>{{"../a.distcp", 4, 1}}, std::vector<ReplicaFile>{{"/abs", 4, 1}},
        std::vector<ReplicaFile>{f, f}}) {
    r = pull_replicas(t.pull_options("127.0.0.1:1", only));
    EXPECT_EQ(r.status().code(), Code::kInvalidArgument) << r.status().to_string();
    expect_mentions(r.status(), {only[0].path});
  }
  EXPECT_FALSE(fs::exists(t.dst));
}

}  // namespace
}  // namespace ferry::checkpoint
