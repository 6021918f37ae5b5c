// `ferry ckpt replicate` in the library, over each transport (replicate_wires.h): a server
// on 127.0.0.1 with an ephemeral port (net) or at a fresh "@name" (shm) and pullers on
// threads (each with its own transports), a hand-crafted malicious server, and a real server
// process killed mid-file (this binary re-executed as the child).
#include "megatron/replicate.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <future>
#include <map>
#include <optional>
#include <thread>

#include "base/clock.h"
#include "ferry/megatron.h"
#include "megatron/megatron_fixture.h"
#include "megatron/replicate_server_thread.h"
#include "megatron/replicate_wires.h"
#include "support/status_matchers.h"
#include "transport/registry.h"
#include "transport/transport.h"

namespace ferry::checkpoint {
namespace {

using std::chrono::milliseconds;
using test::dist_path;
using test::Wire;
namespace fs = std::filesystem;
namespace rp = replicate;

constexpr milliseconds kTimeout{10'000};

struct Nodes {
  explicit Nodes(Wire w = Wire::kNet) : wire(w) {}
  testing::TempDir dir;
  std::string n0 = dir.file("node0"), n1 = dir.file("node1");
  std::string token = test::write_token(dir, "token", ::ferry::testing::kTestToken);
  Wire wire;  // what servers listen on: each at a fresh address
  std::vector<std::string> roots() const { return {n0, n1}; }
  ReplicateServeOptions serve_options() const {
    return {.root = n0, .address = test::listen_address(wire), .token_file = token};
  }
  ReplicatePullOptions pull_options(const std::string& from) const {
    return {.root = n1, .from = from, .token_file = token, .timeout = kTimeout};
  }
};

void expect_same_file(const std::string& a, const std::string& b) {
  const std::string x = test::slurp(a), y = test::slurp(b);
  EXPECT_NE(x, "<missing>") << a;
  EXPECT_EQ(testing::hash_bytes(as_bytes(x)), testing::hash_bytes(as_bytes(y))) << b;
  EXPECT_EQ(x.size(), y.size()) << b;
}

bool has_temp_file(const std::string& root) {
  for (const std::string& f : test::tree(root)) {
    if (f.find(".tmp.") != std::string::npos) return true;
  }
  return false;
}

// The behaviours every transport must keep; each TEST_P runs over net and shm.
class Replicate : public ::testing::TestWithParam<Wire> {};
FERRY_REPLICATE_OVER_WIRES(Replicate);

TEST_P(Replicate, CopiesMetadataBitExactThenVerifyIsClean) {
  Nodes t(GetParam());
  test::write_verl_save(t.roots(), {.step = 1, .roles = {"actor", "critic"}});
  test::write_verl_save(t.roots(),
                        {.step = 2, .roles = {"actor", "critic"}, .dcp_metadata_bytes = 70'000});
  auto before = verify_megatron(t.roots());
  ASSERT_OK(before);
  ASSERT_FALSE(before->ok());

  auto so = t.serve_options();
  so.chunk_bytes = 4096;  // .metadata crosses many data messages
  ServerThread server(so);
  ASSERT_FALSE(server.address().empty());
  std::vector<PullRound> rounds;
  auto po = t.pull_options(server.address());
  po.on_round = [&](const PullRound& r) { rounds.push_back(r); };
  std::uint64_t progress_done = 0, progress_total = 0;
  po.progress = [&](std::uint64_t d, std::uint64_t total) {
    EXPECT_GT(d, progress_done);
    progress_done = d;
    progress_total = total;
  };
  auto r = pull_replicas(po);
  ASSERT_OK(r);
  EXPECT_EQ(r->files_copied, 13u);  // 2 steps x 2 roles x 3 files + the tracker
  EXPECT_EQ(progress_done, r->bytes_copied);
  EXPECT_EQ(progress_total, r->bytes_copied);
  po.progress = {};
  EXPECT_EQ(r->tracker, 2);
  ASSERT_EQ(rounds.size(), 1u);
  EXPECT_EQ(rounds[0].copied.back().path, "latest_checkpointed_iteration.txt");  // last
  for (std::int64_t step : {1, 2}) {
    for (const char* role : {"actor", "critic"}) {
      for (const char* f : {"common.pt", ".metadata", "metadata.json"}) {
        const std::string rel = dist_path(step, role) + "/" + f;
        expect_same_file(t.n0 + "/" + rel, t.n1 + "/" + rel);
      }
    }
  }
  EXPECT_EQ(test::slurp(t.n1 + "/latest_checkpointed_iteration.txt"), "2");
  // Only metadata moves: node1's shards are its own, and rank 0's stay on node0.
  EXPECT_FALSE(fs::exists(t.n1 + "/" + dist_path(1) + "/__0_0.distcp"));
  EXPECT_FALSE(fs::exists(t.n1 + "/global_step_1/actor/huggingface"));
  EXPECT_FALSE(has_temp_file(t.n1));

  auto after = verify_megatron(t.roots());
  ASSERT_OK(after);
  EXPECT_TRUE(after->ok());

  // A second pull finds everything identical and copies nothing.
  rounds.clear();
  r = pull_replicas(po);
  ASSERT_OK(r);
  EXPECT_EQ(r->files_copied, 0u);
  ASSERT_EQ(rounds.size(), 1u);
  EXPECT_EQ(rounds[0].unchanged, 13u);

  // A copy that went bad on node1 is replaced by the next pull.
  test::put(t.n1 + "/" + dist_path(2) + "/common.pt", "PK\x03\x04 stale");
  r = pull_replicas(po);
  ASSERT_OK(r);
  EXPECT_EQ(r->files_copied, 1u);
  expect_same_file(t.n0 + "/" + dist_path(2) + "/common.pt",
                   t.n1 + "/" + dist_path(2) + "/common.pt");
  EXPECT_OK(server.stop());
}

TEST_P(Replicate, ServerWithClientsCountReturnsAfterThatManyPulls) {
  Nodes t(GetParam());
  test::write_verl_save(t.roots(), {.step = 1});
  auto so = t.serve_options();
  so.clients = 1;
  std::promise<std::string> bound;
  so.on_listening = [&](const std::string& a) { bound.set_value(a); };
  auto served = std::async(std::launch::async, [so] { return serve_replicas(so); });
  const std::string address = bound.get_future().get();
  auto r = pull_replicas(t.pull_options(address));
  ASSERT_OK(r);
  ASSERT_EQ(served.wait_for(std::chrono::seconds(5)), std::future_status::ready);
  EXPECT_OK(served.get());
}

TEST(ReplicateNet, WrongTokenIsRefusedAndNothingIsWritten) {
  Nodes t;
  test::write_verl_save(t.roots(), {.step = 1});
  ServerThread server(t.serve_options());
  const auto before = test::tree(t.n1);
  auto po = t.pull_options(server.address());
  po.token_file = test::write_token(t.dir, "wrong", ::ferry::testing::kOtherTestToken);
  auto r = pull_replicas(po);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kUnauthenticated) << r.status().to_string();
  EXPECT_NE(r.status().message().find("refused our token"), std::string::npos)
      << r.status().to_string();
  EXPECT_EQ(test::tree(t.n1), before);

  // The server goes on serving pullers with the right token.
  r = pull_replicas(t.pull_options(server.address()));
  EXPECT_OK(r);
}

// A hand-crafted server on its own thread and transports: listens on the wire of `t`,
// accepts one puller, runs `body`, then reads until the puller hangs up.
class CraftedServer {
 public:
  CraftedServer(const Nodes& t, std::function<void(transport::Channel&)> body) {
    std::promise<std::string> bound;
    auto address = bound.get_future();
    thread_ = std::thread(
        [&bound, at = test::listen_address(t.wire), token_file = t.token, body = std::move(body)] {
          transport::Registry transports({.secret_file = token_file});
          auto l = transports.listen(at);
          if (!l.ok()) return bound.set_value("");
          bound.set_value((*l)->address());
          auto ch = (*l)->accept(kTimeout);
          if (!ch.ok()) return;
          body(**ch);
          while ((*ch)->receive(milliseconds(2000)).ok()) {
          }
        });
    address_ = address.get();
  }
  ~CraftedServer() { thread_.join(); }
  const std::string& address() const { return address_; }

 private:
  std::string address_;
  std::thread thread_;
};

TEST_P(Replicate, PathsThatLeaveTheFolderFromAMaliciousServerAreRefused) {
  Nodes t(GetParam());
  test::write_verl_save(t.roots(), {.step = 1});
  fs::create_directories(t.dir.file("outside"));
  fs::create_directory_symlink(t.dir.file("outside"), t.n1 + "/global_step_1/link");
  const auto before = test::tree(t.n1);
  const std::vector<std::string> evil = {
      "../escape/global_step_1/common.pt",
      "global_step_1/../../escape.pt",
      "global_step_1/actor/../../../common.pt",
      "/abs/global_step_1/common.pt",
      "global_step_1/actor/dist_ckpt/evil.sh",
      "global_step_1/link/dist_ckpt/common.pt",  // a symbolic link on the way out
      ".bashrc",
  };
  for (const std::string& path : evil) {
    SCOPED_TRACE(path);
    std::atomic<bool> got_get{false};
    {
      CraftedServer server(t, [&](transport::Channel& ch) {
        if (!ch.receive(kTimeout).ok()) return;  // LIST
        ReplicaSet set;
        set.files = {{dist_path(1) + "/common.pt", 6, 1}, {path, 6, 1}};
        (void)ch.send(rp::encode_index(set), kTimeout);
        auto m = ch.receive(milliseconds(1000));
        got_get = m.ok();
      });
      auto r = pull_replicas(t.pull_options(server.address()));
      ASSERT_FALSE(r.ok());
      EXPECT_EQ(r.status().code(), Code::kInvalidArgument) << r.status().to_string();
      EXPECT_NE(r.status().message().find(path), std::string::npos) << r.status().to_string();
      EXPECT_NE(r.status().message().find("refused"), std::string::npos) << r.status().to_string();
    }
    EXPECT_FALSE(got_get) << "the puller asked for a file after an offer it must refuse";
    EXPECT_EQ(test::tree(t.n1), before);
    EXPECT_TRUE(test::tree(t.dir.file("outside")).empty());
    EXPECT_FALSE(fs::exists(t.dir.file("escape.pt")));
    EXPECT_FALSE(fs::exists(t.dir.file("escape")));
  }
}

TEST_P(Replicate, BytesThatDoNotMatchTheOfferAreDiscarded) {
  Nodes t(GetParam());
  fs::create_directories(t.n1);
  const std::string rel = dist_path(1) + "/common.pt";
  const std::string good = "PK\x03\x04 the real bytes";
  const std::string bad = "PK\x03\x04 other bytes!!!";
  ASSERT_EQ(good.size(), bad.size());
  CraftedServer server(t, [&](transport::Channel& ch) {
    if (!ch.receive(kTimeout).ok()) return;
    ReplicaSet set;
    const ReplicaFile f{rel, good.size(), testing::hash_bytes(as_bytes(good))};
    set.files = {f};
    (void)ch.send(rp::encode_index(set), kTimeout);
    if (!ch.receive(kTimeout).ok()) return;  // GET
    (void)ch.send(rp::encode_file(f), kTimeout);
    (void)ch.send(rp::encode_chunk(0, as_bytes(bad)), kTimeout);
  });
  auto r = pull_replicas(t.pull_options(server.address()));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kCorruption) << r.status().to_string();
  EXPECT_NE(r.status().message().find("XXH3"), std::string::npos) << r.status().to_string();
  EXPECT_TRUE(test::tree(t.n1).empty());
}

// A crafted server that answers as a real one does, from `files` (path -> bytes) and the
// INDEX `set`, whatever that set claims: each LIST with the set, each GET with the file's
// bytes in one CHUNK, until DONE or the puller hangs up.
void serve_crafted(transport::Channel& ch, const ReplicaSet& set,
                   const std::map<std::string, std::string>& files) {
  while (true) {
    auto m = ch.receive(kTimeout);
    if (!m.ok()) return;
    auto kind = rp::decode_kind(*m, "puller");
    if (!kind.ok() || *kind == rp::Kind::kDone) return;
    if (*kind == rp::Kind::kList) {
      if (!ch.send(rp::encode_index(set), kTimeout).ok()) return;
      continue;
    }
    if (*kind != rp::Kind::kGet) return;
    auto want = rp::decode_get(*m, "puller");
    if (!want.ok()) return;
    const std::string& bytes = files.at(want->path);
    if (!ch.send(rp::encode_file(*want), kTimeout).ok()) return;
    if (!bytes.empty() && !ch.send(rp::encode_chunk(0, as_bytes(bytes)), kTimeout).ok()) return;
  }
}

ReplicaFile offer(std::map<std::string, std::string>& files, const std::string& path,
                  const std::string& bytes) {
  files[path] = bytes;
  return {path, bytes.size(), testing::hash_bytes(as_bytes(bytes))};
}

// Issue 31: a server could make the puller write a tracker naming a step it never sent (its
// INDEX claimed one step, offered another's metadata or only part of it, or a tracker without
// naming a step). The puller writes a tracker only for a step whose metadata the same INDEX
// offered in full, all of it in place and checked before the tracker is written; an INDEX
// that breaks this is refused before anything is written.
TEST_P(Replicate, AServerOfferingATrackerForAStepItDoesNotSendIsRefused) {
  struct Case {
    const char* what;
    std::optional<std::int64_t> claimed;  // the INDEX's tracker step
    std::string tracker_text;             // the tracker's bytes
    bool with_config;                     // step 1's metadata.json offered too
    const char* names;                    // the error names this
  };
  const std::vector<Case> cases = {
      {"names step 7, sends step 1", 7, "7", true, "step 7"},
      {"a tracker with no step named", std::nullopt, "1", true, "names no step"},
      {"step 1 without its metadata.json", 1, "1", false, "2 of common.pt"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    Nodes t(GetParam());
    fs::create_directories(t.n1);
    std::map<std::string, std::string> files;
    ReplicaSet set;
    set.files.push_back(offer(files, dist_path(1) + "/common.pt", "PK\x03\x04 common"));
    set.files.push_back(offer(files, dist_path(1) + "/.metadata", "dcp metadata"));
    if (c.with_config) {
      set.files.push_back(offer(files, dist_path(1) + "/metadata.json", test::kMegatronConfigJson));
    }
    set.files.push_back(offer(files, std::string(kMegatronTracker), c.tracker_text));
    set.tracker = c.claimed;
    Result<PullResult> r = internal_error("not run");
    {
      CraftedServer server(t, [&](transport::Channel& ch) { serve_crafted(ch, set, files); });
      r = pull_replicas(t.pull_options(server.address()));
    }
    ASSERT_FALSE(r.ok()) << "the puller took it and wrote the tracker \""
                         << test::slurp(t.n1 + "/" + std::string(kMegatronTracker)) << '"';
    EXPECT_EQ(r.status().code(), Code::kCorruption) << r.status().to_string();
    EXPECT_NE(r.status().message().find(c.names), std::string::npos) << r.status().to_string();
    EXPECT_NE(r.status().message().find("nothing written"), std::string::npos)
        << r.status().to_string();
    EXPECT_TRUE(test::tree(t.n1).empty()) << "written: " << test::tree(t.n1).front();
  }
}

// The INDEX names step 1 and offers all of step 1, but the tracker's bytes name step 7: the
// metadata is copied, the tracker is not; a one-shot pull lists again (a tracker that moved
// on between the server's scan and its hash is the honest cause) and then gives up saying why.
TEST_P(Replicate, ATrackerWhoseBytesNameAnotherStepThanItsIndexIsNotWritten) {
  Nodes t(GetParam());
  fs::create_directories(t.n1);
  std::map<std::string, std::string> files;
  ReplicaSet set;
  set.files.push_back(offer(files, dist_path(1) + "/common.pt", "PK\x03\x04 common"));
  set.files.push_back(offer(files, dist_path(1) + "/.metadata", "dcp metadata"));
  set.files.push_back(offer(files, dist_path(1) + "/metadata.json", test::kMegatronConfigJson));
  set.files.push_back(offer(files, std::string(kMegatronTracker), "7\n"));
  set.tracker = 1;
  Result<PullResult> r = internal_error("not run");
  {
    CraftedServer server(t, [&](transport::Channel& ch) { serve_crafted(ch, set, files); });
    r = pull_replicas(t.pull_options(server.address()));
  }
  const std::string tracker = t.n1 + "/" + std::string(kMegatronTracker);
  ASSERT_FALSE(r.ok()) << "the puller wrote the tracker \"" << test::slurp(tracker) << '"';
  EXPECT_EQ(r.status().code(), Code::kFailedPrecondition) << r.status().to_string();
  EXPECT_NE(r.status().message().find("names step 7, not step 1"), std::string::npos)
      << r.status().to_string();
  EXPECT_FALSE(fs::exists(tracker));
  for (const char* f : {"common.pt", ".metadata", "metadata.json"}) {
    EXPECT_EQ(test::slurp(t.n1 + "/" + dist_path(1) + "/" + f), files.at(dist_path(1) + "/" + f));
  }
}

TEST_P(Replicate, WatchCopiesAStepOnlyOnceTheTrackerNamesItComplete) {
  Nodes t(GetParam());
  test::write_verl_save(t.roots(), {.step = 1});
  // Step 2 half written on node0: shards, common.pt, .metadata; no metadata.json, tracker at 1.
  test::write_verl_save(t.roots(), {.step = 2, .finished = false});
  ServerThread server(t.serve_options());

  std::atomic<int> rounds{0};
  std::atomic<bool> stop{false};
  auto po = t.pull_options(server.address());
  po.watch = true;
  po.watch_interval = milliseconds(50);
  po.stop = [&] { return stop.load(); };
  po.on_round = [&](const PullRound&) { ++rounds; };
  auto watch = std::async(std::launch::async, [po] { return pull_replicas(po); });
  const auto wait_rounds = [&](int n) {
    const auto deadline = Clock::now() + kTimeout;
    while (rounds < n && Clock::now() < deadline) std::this_thread::sleep_for(milliseconds(10));
    return rounds >= n;
  };
  const std::string step2 = t.n1 + "/" + dist_path(2);

  ASSERT_TRUE(wait_rounds(3));
  EXPECT_TRUE(fs::exists(t.n1 + "/" + dist_path(1) + "/metadata.json"));
  EXPECT_EQ(test::slurp(t.n1 + "/latest_checkpointed_iteration.txt"), "1");
  EXPECT_FALSE(fs::exists(step2 + "/common.pt"));  // the save of step 2 is still running

  // Megatron finishes (metadata.json last) but verl has not moved the tracker: still waits.
  test::put(t.n0 + "/" + dist_path(2) + "/metadata.json", test::kMegatronConfigJson);
  const int seen = rounds;
  ASSERT_TRUE(wait_rounds(seen + 3));
  EXPECT_FALSE(fs::exists(step2 + "/common.pt"));
  EXPECT_FALSE(fs::exists(step2 + "/metadata.json"));

  testing::write_bytes(t.n0 + "/latest_checkpointed_iteration.txt", "2");
  const auto deadline = Clock::now() + kTimeout;
  while (test::slurp(t.n1 + "/latest_checkpointed_iteration.txt") != "2" &&
         Clock::now() < deadline) {
    std::this_thread::sleep_for(milliseconds(10));
  }
  EXPECT_EQ(test::slurp(t.n1 + "/latest_checkpointed_iteration.txt"), "2");
  for (const char* f : {"common.pt", ".metadata", "metadata.json"}) {
    expect_same_file(t.n0 + "/" + dist_path(2) + "/" + f, step2 + "/" + f);
  }
  stop = true;
  ASSERT_EQ(watch.wait_for(std::chrono::seconds(5)), std::future_status::ready);
  auto r = watch.get();
  ASSERT_OK(r);
  EXPECT_EQ(r->stopped, "stop requested");
  EXPECT_EQ(r->files_copied, 8u);  // step 1 and tracker "1", then step 2 and tracker "2"
  EXPECT_TRUE(verify_megatron(t.roots())->ok());
}

TEST_P(Replicate, WatchEndsCleanlyWhenTheServerGoesAway) {
  Nodes t(GetParam());
  test::write_verl_save(t.roots(), {.step = 1});
  auto server = std::make_unique<ServerThread>(t.serve_options());
  std::atomic<int> rounds{0};
  auto po = t.pull_options(server->address());
  po.watch = true;
  po.watch_interval = milliseconds(20);
  po.on_round = [&](const PullRound&) { ++rounds; };
  auto watch = std::async(std::launch::async, [po] { return pull_replicas(po); });
  const auto deadline = Clock::now() + kTimeout;
  while (rounds < 2 && Clock::now() < deadline) std::this_thread::sleep_for(milliseconds(10));
  ASSERT_GE(rounds, 2);
  server.reset();
  ASSERT_EQ(watch.wait_for(std::chrono::seconds(5)), std::future_status::ready);
  auto r = watch.get();
  ASSERT_OK(r);
  EXPECT_NE(r->stopped.find("replicate server"), std::string::npos) << r->stopped;
  EXPECT_EQ(r->tracker, 1);
}

TEST_P(Replicate, ServerSendsOnlyWhatItOffered) {
  Nodes t(GetParam());
  test::write_verl_save(t.roots(), {.step = 1});
  test::write_verl_save(t.roots(), {.step = 2, .finished = false});
  testing::write_bytes(t.dir.file("secret"), "not for the network");
  ServerThread server(t.serve_options());
  transport::Registry transports({.secret_file = t.token});
  auto connected = transports.connect(server.address(), kTimeout);
  ASSERT_OK(connected);
  auto& ch = *connected;
  ASSERT_OK(ch->send(rp::encode_list(), kTimeout));
  auto m = ch->receive(kTimeout);
  ASSERT_OK(m);
  auto index = rp::decode_index(*m, "server");
  ASSERT_OK(index);
  EXPECT_EQ(index->files.size(), 4u);  // step 1 and the tracker; not step 2, still being saved
  const auto ask = [&](const ReplicaFile& f) {
    EXPECT_OK(ch->send(rp::encode_get(f), kTimeout));
    auto a = ch->receive(kTimeout);
    EXPECT_OK(a);
    return a.ok() ? *a : std::vector<std::byte>{};
  };
  for (const std::string& path :
       {std::string("../secret"), dist_path(1) + "/__0_0.distcp", dist_path(2) + "/common.pt"}) {
    SCOPED_TRACE(path);
    const auto answer = ask({path, 0, 0});
    ASSERT_EQ(*rp::decode_kind(answer, "server"), rp::Kind::kError);
    EXPECT_EQ(rp::decode_error(answer, "server")->code, rp::ErrorCode::kNotOffered);
  }
  // An offered file whose bytes changed since the INDEX is refused as changed, not sent.
  ReplicaFile common = index->files[0];
  ASSERT_EQ(common.path, dist_path(1) + "/common.pt");
  test::put(t.n0 + "/" + common.path, "PK\x03\x04 re-saved");
  const auto answer = ask(common);
  ASSERT_EQ(*rp::decode_kind(answer, "server"), rp::Kind::kError);
  EXPECT_EQ(rp::decode_error(answer, "server")->code, rp::ErrorCode::kChanged);
  ch->close();
}

TEST_P(Replicate, AServerThatCannotReadItsFolderSaysSo) {
  Nodes t(GetParam());
  test::write_verl_save(t.roots(), {.step = 1});
  ServerThread server(t.serve_options());
  fs::rename(t.n0, t.dir.file("moved"));
  auto r = pull_replicas(t.pull_options(server.address()));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kFailedPrecondition) << r.status().to_string();
  EXPECT_NE(r.status().message().find("is not a folder"), std::string::npos)
      << r.status().to_string();
}

TEST(ReplicateOptions, BadOptionsAreClearErrors) {
  Nodes t;
  auto po = t.pull_options("127.0.0.1:1");
  po.watch = true;
  po.watch_interval = milliseconds(0);
  auto r = pull_replicas(po);
  EXPECT_EQ(r.status().code(), Code::kInvalidArgument);
  EXPECT_NE(r.status().message().find("watch interval"), std::string::npos);
  auto so = t.serve_options();
  so.root = t.dir.file("absent");
  EXPECT_EQ(serve_replicas(so).code(), Code::kNotFound);
  testing::write_bytes(t.dir.file("plain"), "x");
  po = t.pull_options("127.0.0.1:1");
  po.root = t.dir.file("plain");
  EXPECT_EQ(pull_replicas(po).status().code(), Code::kFailedPrecondition);
}

// ---- a real server process killed mid-file ----

// In the child: serve FERRY_REPLICATE_TEST_ROOT in 4 KiB messages, slowly for .metadata
// (50 ms a message), so that the parent kills it with that file half sent.
const bool kChildRan = [] {
  const char* root = std::getenv("FERRY_REPLICATE_TEST_ROOT");
  if (root == nullptr || std::getenv("FERRY_REPLICATE_TEST_ADDRESS") == nullptr) return false;
  ReplicateServeOptions o;
  o.root = root;
  o.address = std::getenv("FERRY_REPLICATE_TEST_ADDRESS");
  o.token_file = std::getenv("FERRY_REPLICATE_TEST_TOKEN");
  o.chunk_bytes = 4096;
  o.on_listening = [](const std::string& address) {
    const std::string s = address + "\n";
    (void)!::write(1, s.data(), s.size());
  };
  o.test_after_chunk = [](const std::string& path, std::uint64_t) {
    if (path.size() >= 10 && path.compare(path.size() - 10, 10, "/.metadata") == 0) {
      std::this_thread::sleep_for(milliseconds(50));
    }
  };
  std::_Exit(serve_replicas(o).ok() ? 0 : 1);
}();

TEST_P(Replicate, AServerKilledMidFileLeavesNoPartialFile) {
  Nodes t(GetParam());
  test::write_verl_save(t.roots(), {.step = 1, .dcp_metadata_bytes = 64 * 1024});
  test::Spawned child(test::self_binary(), {},
                      {"FERRY_REPLICATE_TEST_ROOT=" + t.n0, "FERRY_REPLICATE_TEST_TOKEN=" + t.token,
                       "FERRY_REPLICATE_TEST_ADDRESS=" + test::listen_address(t.wire)});
  const std::string address = child.read_line();
  ASSERT_EQ(address.rfind(GetParam() == Wire::kNet ? "127.0.0.1:" : "@", 0), 0u) << address;
  // common.pt (2000 bytes) comes first; more than that received means .metadata is under way.
  std::atomic<std::uint64_t> received{0};
  auto po = t.pull_options(address);
  po.progress = [&](std::uint64_t done, std::uint64_t) { received = done; };
  auto pull = std::async(std::launch::async, [po] { return pull_replicas(po); });
  const auto deadline = Clock::now() + kTimeout;
  while (received <= 2000 && Clock::now() < deadline) std::this_thread::sleep_for(milliseconds(1));
  ASSERT_GT(received, 2000u);
  ASSERT_LT(received, 2000u + 64 * 1024);
  // .metadata is under way in memory: nothing of it is on disk yet.
  EXPECT_FALSE(fs::exists(t.n1 + "/" + dist_path(1) + "/.metadata"));
  child.kill();
  ASSERT_EQ(pull.wait_for(std::chrono::seconds(5)), std::future_status::ready);
  auto r = pull.get();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kAborted) << r.status().to_string();
  EXPECT_NE(r.status().message().find(".metadata"), std::string::npos) << r.status().to_string();
  const std::string d = t.n1 + "/" + dist_path(1);
  EXPECT_FALSE(fs::exists(d + "/.metadata"));
  EXPECT_FALSE(has_temp_file(t.n1));
  // What did arrive arrived whole (common.pt comes first); the tracker, last, did not.
  expect_same_file(t.n0 + "/" + dist_path(1) + "/common.pt", d + "/common.pt");
  EXPECT_FALSE(fs::exists(t.n1 + "/latest_checkpointed_iteration.txt"));
}

}  // namespace
}  // namespace ferry::checkpoint
