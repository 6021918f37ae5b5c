// The checkpoint's bytes on disk, against tests/checkpoint/testdata/golden_v1: two nodes'
// roots saved by ferry before the shard format became an interface (issue 33). A save of the
// same state writes every file byte for byte the same (manifest, shards, markers, latest),
// and the stored checkpoint loads bit-exact, so a change to the manifest's or the shards'
// shape fails here. Regenerate only for an intended change of the format (and say so in
// docs/checkpoint-format.md):
//   FERRY_UPDATE_GOLDEN=1 build/tests/checkpoint/checkpoint_test --gtest_filter='Golden*'
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "base/file_util.h"
#include "ckpt_test_util.h"
#include "ferry/checkpoint.h"
#include "support/status_matchers.h"

namespace ferry::checkpoint {
namespace {

namespace fs = std::filesystem;

constexpr std::int64_t kStep = 5;
constexpr const char* kCommon = R"({"epoch":2})";

std::string golden_dir() {
  return std::string(FERRY_SOURCE_DIR) + "/tests/checkpoint/testdata/golden_v1";
}

// The global state, with bytes that depend on nothing but their position.
std::vector<test::GlobalTensor> golden_state() {
  std::vector<test::GlobalTensor> out;
  auto add = [&](std::string name, DType dtype, std::vector<std::int64_t> shape) {
    test::GlobalTensor t{{std::move(name), dtype, std::move(shape)}, {}};
    t.data.resize(t.spec.bytes());
    for (std::size_t i = 0; i < t.data.size(); ++i) {
      t.data[i] = static_cast<std::byte>((i * 7 + out.size() * 13 + 1) & 0xff);
    }
    out.push_back(std::move(t));
  };
  add("a.weight", DType::kBF16, {6, 4});  // rows split over the two ranks
  add("b.bias", DType::kF32, {5});        // whole on both ranks: replicas
  add("c.cols", DType::kF16, {2, 6});     // columns split over the two ranks
  add("d.step", DType::kI64, {1});        // on rank 0 only
  return out;
}

// Rank r's slices of golden_state() (2 ranks, rank r on node n<r>).
std::vector<test::OwnedSlice> golden_slices(const std::vector<test::GlobalTensor>& state, int r) {
  std::vector<test::OwnedSlice> out;
  out.push_back(test::cut(state[0], r, 2, 0));
  out.push_back(test::cut(state[1], 0, 1, 0));
  out.push_back(test::cut(state[2], r, 2, 1));
  if (r == 0) out.push_back(test::cut(state[3], 0, 1, 0));
  return out;
}

// Every file under `root`, by path relative to it, with its bytes.
std::map<std::string, std::string> read_tree(const std::string& root) {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(root)) {
    if (!e.is_regular_file()) continue;
    auto text = read_file(e.path().string());
    EXPECT_OK(text);
    out[fs::relative(e.path(), root).string()] = text.ok() ? *text : "";
  }
  return out;
}

void save_golden(const std::string& dir) {
  const auto state = golden_state();
  test::run_group(
      2, [](int r) { return "n" + std::to_string(r); },
      [&](RankGroup& g) {
        Checkpointer ckpt(g, {.root = dir + "/" + g.node()});
        auto slices = golden_slices(state, g.rank());
        auto v = test::views(slices);
        EXPECT_OK(ckpt.save(kStep, v, kCommon));
      });
}

TEST(Golden, SaveWritesTheSameBytesAsTheStoredCheckpoint) {
  testing::TempDir tmp;
  save_golden(tmp.path());
  if (const char* update = std::getenv("FERRY_UPDATE_GOLDEN"); update && *update == '1') {
    fs::remove_all(golden_dir());
    fs::create_directories(golden_dir());
    fs::copy(tmp.path(), golden_dir(), fs::copy_options::recursive);
    GTEST_SKIP() << "wrote " << golden_dir();
  }
  for (const char* node : {"n0", "n1"}) {
    const auto want = read_tree(golden_dir() + "/" + node);
    const auto got = read_tree(tmp.path() + "/" + node);
    ASSERT_FALSE(want.empty()) << golden_dir() << "/" << node << " is missing";
    std::vector<std::string> want_names, got_names;
    for (const auto& [name, bytes] : want) want_names.push_back(name);
    for (const auto& [name, bytes] : got) got_names.push_back(name);
    ASSERT_EQ(got_names, want_names) << "node " << node;
    for (const auto& [name, bytes] : want) {
      EXPECT_TRUE(got.at(name) == bytes) << node << "/" << name << " changed:\n--- stored\n"
                                         << bytes << "\n--- saved now\n"
                                         << got.at(name);
    }
  }
}

TEST(Golden, TheStoredCheckpointLoadsBitExact) {
  testing::TempDir tmp;
  fs::copy(golden_dir(), tmp.path(), fs::copy_options::recursive);
  const auto state = golden_state();
  // Each of the two ranks asks for every tensor whole: its own node's slices from disk, the
  // others fetched from the other rank.
  test::run_group(
      2, [](int r) { return "n" + std::to_string(r); },
      [&](RankGroup& g) {
        Checkpointer ckpt(g, {.root = tmp.path() + "/" + g.node()});
        auto info = ckpt.prepare_load();
        ASSERT_OK(info);
        EXPECT_EQ(info->step, kStep);
        EXPECT_EQ(info->manifest.common_state, kCommon);
        std::vector<test::OwnedSlice> got;
        for (const test::GlobalTensor& t : state) {
          got.push_back(test::cut(t, 0, 1, 0));
          std::fill(got.back().data.begin(), got.back().data.end(), std::byte{0});
        }
        auto dst = test::mutable_views(got);
        auto stats = ckpt.load(dst);
        ASSERT_OK(stats);
        EXPECT_GT(stats->remote_bytes, 0u);
        for (std::size_t i = 0; i < state.size(); ++i) {
          EXPECT_TRUE(got[i].data == state[i].data)
              << state[i].spec.name << " on rank " << g.rank();
        }
      });
}

}  // namespace
}  // namespace ferry::checkpoint
