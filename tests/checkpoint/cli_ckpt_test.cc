// `ferry ckpt save|load|ls|verify|gc` end to end on a small Hugging Face folder.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "base/file_util.h"
#include "ferry/checkpoint.h"
#include "ferry/safetensors.h"
#include "support/status_matchers.h"
#include "support/test_support.h"

namespace ferry::checkpoint {
namespace {

using testing::run_ferry;
namespace fs = std::filesystem;

// A small HF folder: config.json and one model.safetensors.
void write_hf(const std::string& dir) {
  fs::create_directories(dir);
  std::vector<TensorSpec> specs = {{"model.embed_tokens.weight", DType::kBF16, {64, 16}},
                                   {"model.layers.0.mlp.up_proj.weight", DType::kF32, {30, 16}},
                                   {"model.norm.weight", DType::kBF16, {16}},
                                   {"tiny", DType::kI32, {3, 2}},
                                   {"scalar", DType::kF32, {}}};
  auto w = SafetensorsWriter::create(dir + "/model.safetensors", specs);
  ASSERT_OK(w);
  std::uint8_t x = 1;
  for (const TensorSpec& s : specs) {
    std::vector<std::byte> b(s.bytes());
    for (auto& c : b) c = static_cast<std::byte>(x = static_cast<std::uint8_t>(x * 37 + 11));
    ASSERT_OK(w->write(b));
  }
  ASSERT_OK(w->finish());
  testing::write_bytes(dir + "/config.json", R"({"model_type": "qwen2", "hidden_size": 16})");
}

// write_hf's model saved by `ferry ckpt save` as 2 ranks on 2 nodes under dir/ckpt; "" if
// the save failed (the caller asserts).
std::string save_two_node_checkpoint(const testing::TempDir& dir) {
  write_hf(dir.file("hf"));
  const std::string ckpt = dir.file("ckpt");
  const auto r =
      run_ferry({"ckpt", "save", "--from", dir.file("hf"), "--ranks", "2", "--nodes", "2", ckpt});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  return r.exit_code == 0 ? ckpt : "";
}

void expect_same_tensors(const std::string& a, const std::string& b) {
  auto fa = ModelFolder::open(a);
  auto fb = ModelFolder::open(b);
  ASSERT_TRUE(fa.ok() && fb.ok());
  ASSERT_EQ(fa->index().tensors.size(), fb->index().tensors.size());
  for (const TensorView& v : fa->views()) {
    auto o = fb->view(v.spec.name);
    ASSERT_OK(o) << v.spec.name;
    EXPECT_EQ(o->spec, v.spec);
    EXPECT_EQ(testing::hash_bytes(o->data), testing::hash_bytes(v.data)) << v.spec.name;
  }
}

TEST(CkptCli, SaveShardedThenListVerifyAndLoadBackBitExact) {
  testing::TempDir dir;
  write_hf(dir.file("hf"));
  const std::string ckpt = dir.file("ckpt");
  auto save =
      run_ferry({"ckpt", "save", "--from", dir.file("hf"), "--ranks", "4", "--nodes", "2", ckpt});
  ASSERT_EQ(save.exit_code, 0) << save.err;
  EXPECT_TRUE(fs::exists(ckpt + "/node1/step_1/rank_00003.safetensors"));
  EXPECT_FALSE(fs::exists(ckpt + "/node0/step_1/rank_00003.safetensors"));

  auto ls = run_ferry({"ckpt", "ls", "--json", ckpt});
  ASSERT_EQ(ls.exit_code, 0) << ls.err;
  auto j = nlohmann::json::parse(ls.out);
  ASSERT_EQ(j["steps"].size(), 1u);
  EXPECT_EQ(j["steps"][0]["state"], "committed");
  EXPECT_EQ(j["steps"][0]["latest"], true);
  EXPECT_EQ(j["steps"][0]["roots"][1]["node"], "node1");

  auto verify = run_ferry({"ckpt", "verify", "--json", ckpt});
  ASSERT_EQ(verify.exit_code, 0) << verify.out << verify.err;
  EXPECT_EQ(nlohmann::json::parse(verify.out)["ok"], true);

  auto load = run_ferry({"ckpt", "load", ckpt, "--to", dir.file("out")});
  ASSERT_EQ(load.exit_code, 0) << load.err;
  expect_same_tensors(dir.file("hf"), dir.file("out"));
  auto cfg = read_file(dir.file("out/config.json"));
  ASSERT_OK(cfg);
  EXPECT_EQ(nlohmann::json::parse(*cfg)["hidden_size"], 16);

  // A second save is step 2; loading step 1 explicitly still works.
  ASSERT_EQ(
      run_ferry({"ckpt", "save", "--from", dir.file("hf"), "--ranks", "2", "--nodes", "2", ckpt})
          .exit_code,
      0);
  auto old = run_ferry({"ckpt", "load", "--json", "--step", "1", ckpt, "--to", dir.file("out1")});
  ASSERT_EQ(old.exit_code, 0) << old.err;
  EXPECT_EQ(nlohmann::json::parse(old.out)["step"], 1);
}

TEST(CkptCli, VerifyAndLoadNameTheDamagedFileAndTensor) {
  testing::TempDir dir;
  write_hf(dir.file("hf"));
  const std::string ckpt = dir.file("ckpt");
  ASSERT_EQ(
      run_ferry({"ckpt", "save", "--from", dir.file("hf"), "--ranks", "4", "--nodes", "2", ckpt})
          .exit_code,
      0);
  const std::string file = ckpt + "/node1/step_1/rank_00003.safetensors";
  auto header = read_safetensors_header(file);
  ASSERT_OK(header);
  const SafetensorsEntry* e = header->find("model.layers.0.mlp.up_proj.weight");
  ASSERT_NE(e, nullptr);
  {
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(header->data_offset + e->begin + 1));
    f.put('\x7f');
  }
  auto verify = run_ferry({"ckpt", "verify", ckpt});
  EXPECT_EQ(verify.exit_code, 1);
  EXPECT_NE(
      verify.out.find("PROBLEM node node1: " + file + " tensor model.layers.0.mlp.up_proj.weight"),
      std::string::npos)
      << verify.out;
  auto load = run_ferry({"ckpt", "load", ckpt, "--to", dir.file("out")});
  EXPECT_EQ(load.exit_code, 1);
  EXPECT_NE(load.err.find(file), std::string::npos) << load.err;
  EXPECT_NE(load.err.find("model.layers.0.mlp.up_proj.weight"), std::string::npos) << load.err;
  // Issue 15: a failed load left an empty --to folder.
  EXPECT_FALSE(fs::exists(dir.file("out")));
  EXPECT_FALSE(fs::exists(dir.file(".out.tmp." + std::to_string(::getpid()))));

  fs::remove(file);
  auto missing = run_ferry({"ckpt", "verify", "--json", ckpt});
  EXPECT_EQ(missing.exit_code, 1);
  auto j = nlohmann::json::parse(missing.out);
  EXPECT_EQ(j["missing_by_node"]["node1"], nlohmann::json::array({"rank_00003.safetensors"}));
  EXPECT_EQ(j["missing_by_node"]["node0"], nlohmann::json::array());
}

TEST(CkptCli, GcRemovesPartialStepsButNotTheCommittedOne) {
  testing::TempDir dir;
  const std::string ckpt = save_two_node_checkpoint(dir);
  ASSERT_FALSE(ckpt.empty());
  // A save that died after writing one shard.
  fs::create_directories(ckpt + "/node0/step_2");
  fs::copy_file(ckpt + "/node0/step_1/rank_00000.safetensors",
                ckpt + "/node0/step_2/rank_00000.safetensors");
  auto ls = run_ferry({"ckpt", "ls", ckpt});
  ASSERT_EQ(ls.exit_code, 0);
  EXPECT_NE(ls.out.find("step 2  partial"), std::string::npos) << ls.out;
  EXPECT_NE(ls.out.find("step 1  committed  (latest)"), std::string::npos) << ls.out;
  auto dry = run_ferry({"ckpt", "gc", "--dry-run", ckpt});
  EXPECT_NE(dry.out.find("would remove step 2"), std::string::npos) << dry.out;
  EXPECT_TRUE(fs::exists(ckpt + "/node0/step_2"));
  auto gc = run_ferry({"ckpt", "gc", "--json", ckpt});
  ASSERT_EQ(gc.exit_code, 0) << gc.err;
  auto j = nlohmann::json::parse(gc.out);
  ASSERT_EQ(j["actions"].size(), 1u);
  EXPECT_EQ(j["actions"][0]["removed"], true);
  EXPECT_FALSE(fs::exists(ckpt + "/node0/step_2"));
  EXPECT_TRUE(fs::exists(ckpt + "/node0/step_1/COMMITTED"));
  EXPECT_EQ(run_ferry({"ckpt", "load", ckpt, "--to", dir.file("out")}).exit_code, 0);
}

TEST(CkptCli, LoadFetchesAMissingManifestFromTheOtherNodeAndSaysSo) {
  testing::TempDir dir;
  const std::string ckpt = save_two_node_checkpoint(dir);
  ASSERT_FALSE(ckpt.empty());
  fs::remove(ckpt + "/node1/step_1/manifest.json");
  auto load = run_ferry({"ckpt", "load", ckpt, "--to", dir.file("out")});
  ASSERT_EQ(load.exit_code, 0) << load.err;
  EXPECT_NE(load.out.find("note: node node1 has no manifest for step 1; fetched it from rank 0"),
            std::string::npos)
      << load.out;
  expect_same_tensors(dir.file("hf"), dir.file("out"));
}

// The pid of a process that has exited and been reaped: a pid that is gone.
long dead_pid() {
  const pid_t pid = ::fork();
  if (pid == 0) ::_exit(0);
  int st = 0;
  ::waitpid(pid, &st, 0);
  return pid;
}

// Issue 15: load wrote into an existing folder (new model.safetensors, old index.json
// still read first), silently.
TEST(CkptCli, LoadRefusesANonEmptyFolderAndForceReplacesItWhole) {
  testing::TempDir dir;
  const std::string ckpt = save_two_node_checkpoint(dir);
  ASSERT_FALSE(ckpt.empty());
  const std::string out = dir.file("out");
  fs::create_directories(out);
  testing::write_bytes(out + "/model.safetensors.index.json", R"({"weight_map":{}})");
  auto refused = run_ferry({"ckpt", "load", ckpt, "--to", out});
  EXPECT_EQ(refused.exit_code, 1) << refused.err;
  EXPECT_NE(refused.err.find("--to " + out + " exists and is not empty"), std::string::npos)
      << refused.err;
  EXPECT_NE(refused.err.find("--force"), std::string::npos) << refused.err;
  EXPECT_TRUE(fs::exists(out + "/model.safetensors.index.json"));
  EXPECT_FALSE(fs::exists(out + "/model.safetensors"));

  auto forced = run_ferry({"ckpt", "load", ckpt, "--to", out, "--force"});
  ASSERT_EQ(forced.exit_code, 0) << forced.err;
  EXPECT_FALSE(fs::exists(out + "/model.safetensors.index.json"));
  expect_same_tensors(dir.file("hf"), out);
  // An empty folder is not refused.
  fs::create_directories(dir.file("empty"));
  EXPECT_EQ(run_ferry({"ckpt", "load", ckpt, "--to", dir.file("empty")}).exit_code, 0);
  expect_same_tensors(dir.file("hf"), dir.file("empty"));
}

// Issue 15: kill -9 during a load left model.safetensors.tmp.PID, never cleaned. The
// next load removes temps of processes that are gone, and keeps a live one's.
TEST(CkptCli, LoadRemovesTempsLeftByKilledLoadsOnly) {
  testing::TempDir dir;
  const std::string ckpt = save_two_node_checkpoint(dir);
  ASSERT_FALSE(ckpt.empty());
  const std::string dead = std::to_string(dead_pid()), live = std::to_string(::getpid());
  fs::create_directories(dir.file(".out.tmp." + dead));
  testing::write_bytes(dir.file(".out.tmp." + dead + "/model.safetensors"), "partial");
  fs::create_directories(dir.file(".out.tmp." + live));
  fs::create_directories(dir.file("out"));  // an older version's temp inside --to
  testing::write_bytes(dir.file("out/model.safetensors.tmp." + dead), "partial");
  auto load = run_ferry({"ckpt", "load", ckpt, "--to", dir.file("out")});
  ASSERT_EQ(load.exit_code, 0) << load.err;
  EXPECT_FALSE(fs::exists(dir.file(".out.tmp." + dead)));
  EXPECT_FALSE(fs::exists(dir.file("out/model.safetensors.tmp." + dead)));
  EXPECT_TRUE(fs::exists(dir.file(".out.tmp." + live)));  // its process may still be loading
  expect_same_tensors(dir.file("hf"), dir.file("out"));
}

// Issue 15: an invalid config.json was silently dropped, and --step -1 saved step 1.
TEST(CkptCli, SaveRefusesAnInvalidConfigJsonAndANegativeStep) {
  testing::TempDir dir;
  write_hf(dir.file("hf"));
  testing::write_bytes(dir.file("hf/config.json"), R"({"model_type": "qwen2",)");
  auto save = run_ferry({"ckpt", "save", "--from", dir.file("hf"), dir.file("ckpt")});
  EXPECT_EQ(save.exit_code, 1) << save.err;
  EXPECT_NE(save.err.find(dir.file("hf/config.json") + " is not valid JSON: "), std::string::npos)
      << save.err;
  EXPECT_NE(save.err.find("parse error"), std::string::npos) << save.err;
  EXPECT_FALSE(fs::exists(dir.file("ckpt/node0/step_1")));

  write_hf(dir.file("hf"));
  auto negative =
      run_ferry({"ckpt", "save", "--from", dir.file("hf"), "--step", "-1", dir.file("ckpt")});
  EXPECT_EQ(negative.exit_code, 2) << negative.err;
  EXPECT_NE(negative.err.find("--step must be 0 or more, got -1"), std::string::npos)
      << negative.err;
  EXPECT_FALSE(fs::exists(dir.file("ckpt/node0/step_1")));
}

TEST(CkptCli, UsageErrorsExitTwo) {
  testing::TempDir dir;
  EXPECT_EQ(run_ferry({"ckpt", "save", dir.file("x")}).exit_code, 2);  // no --from
  EXPECT_EQ(run_ferry({"ckpt"}).exit_code, 2);
  EXPECT_EQ(run_ferry({"ckpt", "verify", dir.file("nothing")}).exit_code, 1);
}

}  // namespace
}  // namespace ferry::checkpoint
