// `ferry ckpt verify` on verl / Megatron folders and `ferry ckpt replicate` end to end: the
// built binary as server and puller on 127.0.0.1 (net), and at an "@name" (shm).
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <thread>

#include "megatron/megatron_fixture.h"
#include "support/test_support.h"

namespace ferry::checkpoint {
namespace {

using std::chrono::milliseconds;
using test::dist_path;
using testing::run_ferry;
using json = nlohmann::json;
namespace fs = std::filesystem;

struct Folders {
  testing::TempDir dir;
  std::string ckpt = dir.file("ckpt");  // holds node0/, node1/ as verify takes them
  std::string n0 = ckpt + "/node0", n1 = ckpt + "/node1";
  std::string token = test::write_token(dir, "token", ::ferry::testing::kTestToken);
};

TEST(CkptReplicateCli, VerifyNamesTheNodeThenReplicateFixesItAndVerifyIsClean) {
  Folders t;
  test::write_verl_save({t.n0, t.n1}, {.step = 4});

  auto v = run_ferry({"ckpt", "verify", t.ckpt});
  EXPECT_EQ(v.exit_code, 1) << v.out << v.err;
  EXPECT_NE(v.out.find("MISSING node node1 (" + t.n1 + "): " + dist_path(4) + "/common.pt"),
            std::string::npos)
      << v.out;
  EXPECT_NE(v.out.find("FAILED"), std::string::npos);
  v = run_ferry({"ckpt", "verify", "--json", t.n0, t.n1});
  EXPECT_EQ(v.exit_code, 1) << v.err;
  auto j = json::parse(v.out);
  EXPECT_EQ(j["format"], "verl-megatron");
  EXPECT_EQ(j["ok"], false);
  EXPECT_EQ(j["tracker"], 4);
  EXPECT_EQ(j["nodes"][0]["ok"], true);
  EXPECT_EQ(j["nodes"][1]["node"], "node1");
  EXPECT_EQ(j["nodes"][1]["missing"].size(), 4u);

  test::Spawned server(FERRY_BINARY,
                       {"ckpt", "replicate", t.n0, "--serve", "127.0.0.1:0", "--clients", "1",
                        "--json", "--token-file", t.token},
                       {});
  const json listening = json::parse(server.read_line());
  ASSERT_EQ(listening["event"], "listening");
  const std::string address = listening["address"];

  auto pull =
      run_ferry({"ckpt", "replicate", t.n1, "--from", address, "--json", "--token-file", t.token});
  ASSERT_EQ(pull.exit_code, 0) << pull.out << pull.err;
  j = json::parse(pull.out);
  EXPECT_EQ(j["files_copied"], 4);
  EXPECT_EQ(j["tracker"], 4);
  EXPECT_EQ(j["round"]["copied"].back()["path"], "latest_checkpointed_iteration.txt");
  EXPECT_EQ(server.wait(milliseconds(5000)), 0);  // --clients 1: done after one pull

  v = run_ferry({"ckpt", "verify", "--json", t.ckpt});
  EXPECT_EQ(v.exit_code, 0) << v.out << v.err;
  EXPECT_EQ(json::parse(v.out)["ok"], true);
  // ferry's own format still goes to its own verify.
  v = run_ferry({"ckpt", "verify", t.dir.file("no-such-folder")});
  EXPECT_NE(v.exit_code, 0);
  EXPECT_EQ(v.out.find("verl/Megatron"), std::string::npos) << v.out;
}

// Two processes of one node: `--serve @NAME` and `--from @NAME` replicate over shm, with no
// secret anywhere (the kernel checks the puller is the same user).
TEST(CkptReplicateCli, ReplicatesBetweenTwoProcessesOfOneNodeOverShmWithoutASecret) {
  Folders t;
  test::write_verl_save({t.n0, t.n1}, {.step = 2});
  const std::string name = "@ferry-cli-replicate-" + std::to_string(::getpid());
  test::Spawned server(FERRY_BINARY,
                       {"ckpt", "replicate", t.n0, "--serve", name, "--clients", "1", "--json"},
                       {});  // no FERRY_* variables: no secret
  const json listening = json::parse(server.read_line());
  ASSERT_EQ(listening["event"], "listening");
  EXPECT_EQ(listening["address"], name);
  auto pull =
      run_ferry({"ckpt", "replicate", t.n1, "--from", name, "--json"}, {"PATH=/usr/bin:/bin"});
  ASSERT_EQ(pull.exit_code, 0) << pull.out << pull.err;
  const json j = json::parse(pull.out);
  EXPECT_EQ(j["files_copied"], 4);
  EXPECT_EQ(j["tracker"], 2);
  EXPECT_EQ(server.wait(milliseconds(5000)), 0);
  EXPECT_EQ(test::slurp(t.n1 + "/latest_checkpointed_iteration.txt"), "2");
}

// Issue 15 item 2: verify run on one non-rank-0 node's own folder said "tracker absent: OK",
// exit 0, for exactly verl's FAQ failure (that node lacks common.pt, .metadata,
// metadata.json). Verified per node, each node now says what it lacks and how to fix it.
TEST(CkptReplicateCli, VerifyOnEachNodeAloneNamesWhatANonRankZeroNodeLacksAndTheFix) {
  Folders t;
  test::write_verl_save({t.n0, t.n1}, {.step = 4});

  auto v = run_ferry({"ckpt", "verify", t.n0});  // rank 0's node: it has everything
  EXPECT_EQ(v.exit_code, 0) << v.out << v.err;
  EXPECT_NE(v.out.find("OK"), std::string::npos) << v.out;

  v = run_ferry({"ckpt", "verify", t.n1});  // any other node: the FAQ failure
  EXPECT_EQ(v.exit_code, 1) << v.out << v.err;
  for (const std::string& f :
       {dist_path(4) + "/common.pt", dist_path(4) + "/.metadata", dist_path(4) + "/metadata.json",
        std::string("latest_checkpointed_iteration.txt")}) {
    EXPECT_NE(v.out.find("MISSING node node1 (" + t.n1 + "): " + f), std::string::npos) << f << "\n"
                                                                                        << v.out;
  }
  EXPECT_NE(v.out.find("ferry ckpt replicate " + t.n1 + " --from NODE0:PORT"), std::string::npos)
      << v.out;
  EXPECT_NE(v.out.find("FAILED"), std::string::npos) << v.out;
  v = run_ferry({"ckpt", "verify", "--json", t.n1});
  EXPECT_EQ(v.exit_code, 1) << v.err;
  auto j = json::parse(v.out);
  EXPECT_EQ(j["nodes"][0]["missing"].size(), 4u);
  EXPECT_NE(j["nodes"][0]["fix"].get<std::string>().find("--from"), std::string::npos);

  v = run_ferry({"ckpt", "verify", t.ckpt});  // both nodes: node1 named, the fix too
  EXPECT_EQ(v.exit_code, 1) << v.out;
  EXPECT_NE(v.out.find("MISSING node node1"), std::string::npos) << v.out;
  EXPECT_EQ(v.out.find("MISSING node node0"), std::string::npos) << v.out;

  // The whole checkpoint once node1 has its copies: OK.
  for (const std::string& f :
       {dist_path(4) + "/common.pt", dist_path(4) + "/.metadata", dist_path(4) + "/metadata.json",
        std::string("latest_checkpointed_iteration.txt")}) {
    fs::copy_file(t.n0 + "/" + f, t.n1 + "/" + f);
  }
  v = run_ferry({"ckpt", "verify", t.ckpt});
  EXPECT_EQ(v.exit_code, 0) << v.out << v.err;
  v = run_ferry({"ckpt", "verify", t.n1});
  EXPECT_EQ(v.exit_code, 0) << v.out << v.err;
}

TEST(CkptReplicateCli, WatchStopsCleanlyOnSigterm) {
  Folders t;
  test::write_verl_save({t.n0, t.n1}, {.step = 1});
  test::Spawned server(
      FERRY_BINARY, {"ckpt", "replicate", t.n0, "--serve", "127.0.0.1:0", "--token-file", t.token},
      {});
  const std::string line = server.read_line();
  const std::string address = line.substr(line.rfind(' ') + 1);
  ASSERT_EQ(address.rfind("127.0.0.1:", 0), 0u) << line;
  // The token from the environment this time.
  test::Spawned watch(
      FERRY_BINARY,
      {"ckpt", "replicate", t.n1, "--from", address, "--watch", "--watch-interval", "0.05"},
      {"FERRY_TOKEN_FILE=" + t.token});
  EXPECT_EQ(watch.read_line(), "copied " + dist_path(1) + "/common.pt (2000 bytes)");
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!fs::exists(t.n1 + "/latest_checkpointed_iteration.txt") &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(milliseconds(10));
  }
  watch.signal(SIGTERM);
  EXPECT_EQ(watch.wait(milliseconds(5000)), 0);
  server.signal(SIGINT);
  EXPECT_EQ(server.wait(milliseconds(5000)), 0);
  EXPECT_EQ(test::slurp(t.n1 + "/latest_checkpointed_iteration.txt"), "1");
}

TEST(CkptReplicateCli, UsageErrorsSayWhatToDo) {
  Folders t;
  auto r = run_ferry({"ckpt", "replicate", t.n1});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--serve HOST:PORT"), std::string::npos) << r.err;
  r = run_ferry({"ckpt", "replicate", t.n1, "--serve", "127.0.0.1:0", "--from", "127.0.0.1:1"});
  EXPECT_EQ(r.exit_code, 2);
  r = run_ferry({"ckpt", "replicate", t.n1, "--from", "127.0.0.1:1", "--watch-interval", "0"});
  EXPECT_EQ(r.exit_code, 2);
  r = run_ferry({"ckpt", "replicate", t.n1, "--from", "127.0.0.1:1"}, {"PATH=/usr/bin:/bin"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("FERRY_TOKEN"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace ferry::checkpoint
