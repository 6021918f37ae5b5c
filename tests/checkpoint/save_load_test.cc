// Collective save and load over a local group: same layout, resharded to fewer
// and to more nodes, async save, replicas, and refusing bad slice sets.
#include <gtest/gtest.h>

#include <filesystem>
#include <mutex>

#include "checkpoint/fetch_request.h"
#include "checkpoint/format.h"
#include "ckpt_test_util.h"
#include "ferry/safetensors.h"
#include "support/status_matchers.h"

namespace ferry::checkpoint {
namespace {

using test::cut_all;
using test::GlobalTensor;
using test::load_and_check;
using test::make_state;
using test::OwnedSlice;
using test::run_group;
using test::save_state;
using test::state_bytes;
namespace fs = std::filesystem;

TEST(SaveLoad, SameLayoutWritesTheFormatOnEveryNodeAndLoadsBitExact) {
  testing::TempDir dir;
  const auto state = make_state(1);
  save_state(dir.path(), state, 4, 2, 7);
  for (const std::string node : {"n0", "n1"}) {
    const std::string root = dir.path() + "/" + node;
    const std::string step = root + "/step_7";
    EXPECT_TRUE(fs::exists(step + "/manifest.json")) << node;
    EXPECT_TRUE(fs::exists(step + "/NODE_" + node + ".committed")) << node;
    EXPECT_TRUE(fs::exists(step + "/COMMITTED")) << node;
    EXPECT_EQ(format::read_latest(root), 7) << node;
    auto m = format::read_manifest(root, 7);
    ASSERT_OK(m);
    EXPECT_EQ(m->layout.world_size, 4);
    EXPECT_EQ(m->layout.ranks_per_node, 2);
    EXPECT_EQ(m->layout.nodes, (std::vector<std::string>{"n0", "n1"}));
    EXPECT_EQ(m->common_state, R"({"lr":0.001})");
    const SavedTensor* emb = m->find("model.embed_tokens.weight");
    ASSERT_NE(emb, nullptr);
    EXPECT_EQ(emb->shape, (std::vector<std::int64_t>{96, 40}));  // the GLOBAL shape
    ASSERT_EQ(emb->slices.size(), 4u);
    EXPECT_EQ(emb->slices[1].offset, (std::vector<std::int64_t>{24, 0}));
    EXPECT_EQ(emb->slices[1].extent, (std::vector<std::int64_t>{24, 40}));
  }
  // Shards of node n0 are ranks 0 and 1 only, and plain safetensors files.
  EXPECT_TRUE(fs::exists(dir.path() + "/n0/step_7/rank_00001.safetensors"));
  EXPECT_FALSE(fs::exists(dir.path() + "/n0/step_7/rank_00002.safetensors"));
  auto shard = SafetensorsFile::open(dir.path() + "/n1/step_7/rank_00003.safetensors");
  ASSERT_OK(shard);
  auto v = shard->view("model.embed_tokens.weight");
  ASSERT_OK(v);
  EXPECT_EQ(v->spec.shape, (std::vector<std::int64_t>{24, 40}));

  auto r = load_and_check(dir.path(), state, 4, 2, 0);
  EXPECT_EQ(r.step, 7);
  EXPECT_EQ(r.remote, 0u);  // same layout: every slice from the rank's own node
  EXPECT_EQ(r.local, state_bytes(state));
}

TEST(SaveLoad, ReshardFourRanksTwoNodesToTwoRanksOneNode) {
  testing::TempDir dir;
  const auto state = make_state(2);
  save_state(dir.path(), state, 4, 2, 3);
  // One node that holds every shard (as after copying n1's files to it).
  for (const auto& e : fs::directory_iterator(dir.path() + "/n1/step_3")) {
    if (e.path().extension() == ".safetensors") {
      fs::copy_file(e.path(), dir.path() + "/n0/step_3/" + e.path().filename().string());
    }
  }
  auto r = load_and_check(dir.path(), state, 2, 1, /*dim=*/1);  // split along dim 1 now
  EXPECT_EQ(r.step, 3);
  EXPECT_EQ(r.remote, 0u);
  EXPECT_EQ(r.local, state_bytes(state));
}

TEST(SaveLoad, ReshardFourRanksTwoNodesToEightRanksFourNodesFetchesFromPeers) {
  testing::TempDir dir;
  const auto state = make_state(3);
  save_state(dir.path(), state, 4, 2, 5);
  auto r = load_and_check(dir.path(), state, 8, 4, 0);
  EXPECT_EQ(r.step, 5);
  EXPECT_GT(r.remote, 0u);  // n2 and n3 have nothing on disk
  EXPECT_EQ(r.local + r.remote, state_bytes(state));
  bool fetched_manifest = false;
  for (const std::string& n : r.notes) {
    fetched_manifest |=
        n.find("node n2 has no manifest for step 5; fetched it from rank") != std::string::npos;
  }
  EXPECT_TRUE(fetched_manifest);
}

// Issue 15: a full-depth model (290 tensors) saved on 2 nodes and loaded resharded failed:
// the read-ahead named more small slices than a fetch request may carry.
TEST(SaveLoad, ReshardWithMoreSmallTensorsThanOneRequestMayNameAhead) {
  testing::TempDir dir;
  std::vector<GlobalTensor> state;
  for (std::size_t i = 0; i < 3 * kMaxAheadHints; ++i) {
    GlobalTensor t{{"layer." + std::to_string(i) + ".weight", DType::kF32, {4, 6}}, {}};
    t.data.resize(t.spec.bytes());
    for (std::size_t b = 0; b < t.data.size(); ++b) t.data[b] = static_cast<std::byte>(i * 7 + b);
    state.push_back(std::move(t));
  }
  save_state(dir.path(), state, 2, 2, 1);
  // Split along dim 1 now: rank 0 needs part of every slice rank 1 saved on n1.
  auto r = load_and_check(dir.path(), state, 2, 2, /*dim=*/1);
  EXPECT_EQ(r.step, 1);
  EXPECT_EQ(r.remote, state_bytes(state) / 2);
}

TEST(SaveLoad, NewestCommittedStepIsChosenAndOlderOnesStayLoadable) {
  testing::TempDir dir;
  const auto a = make_state(4), b = make_state(5);
  save_state(dir.path(), a, 2, 2, 1);
  save_state(dir.path(), b, 2, 2, 2);
  EXPECT_EQ(load_and_check(dir.path(), b, 2, 2, 0).step, 2);
  EXPECT_EQ(load_and_check(dir.path(), a, 2, 2, 1, 1).step, 1);
}

TEST(SaveLoad, AsyncSaveReturnsAfterStagingAndReportsLaterErrors) {
  testing::TempDir dir;
  const auto state = make_state(6);
  run_group(
      2, [](int r) { return "n" + std::to_string(r); },
      [&](RankGroup& g) {
        Checkpointer ckpt(g, {.root = dir.path() + "/" + g.node()});
        auto slices = cut_all(state, g.rank(), g.size(), 0);
        auto v = test::views(slices);
        ASSERT_OK(ckpt.save_async(1, v));
        // The caller may reuse its memory at once: what was staged is saved.
        for (OwnedSlice& s : slices) std::fill(s.data.begin(), s.data.end(), std::byte{0x5a});
        EXPECT_OK(ckpt.wait());
        // Saving a committed step again fails in the background; the next call says so.
        ASSERT_OK(ckpt.save_async(1, v));
        Status next = ckpt.save_async(2, v);
        EXPECT_EQ(next.code(), Code::kAlreadyExists) << next.to_string();
        EXPECT_OK(ckpt.wait());  // the error was reported once
      });
  EXPECT_EQ(load_and_check(dir.path(), state, 2, 2, 0).step, 1);
}

TEST(SaveLoad, ReplicatedTensorsAreSavedOnceEachAndLoadFromTheLocalReplica) {
  testing::TempDir dir;
  const auto state = make_state(7);
  run_group(
      2, [](int r) { return "n" + std::to_string(r); },
      [&](RankGroup& g) {
        Checkpointer ckpt(g, {.root = dir.path() + "/" + g.node()});
        std::vector<OwnedSlice> all;
        for (const GlobalTensor& t : state)
          all.push_back(test::cut(t, 0, 1, 0));  // whole, on every rank
        auto v = test::views(all);
        ASSERT_OK(ckpt.save(1, v));
      });
  auto r = load_and_check(dir.path(), state, 2, 2, 0);
  EXPECT_EQ(r.remote, 0u);
}

TEST(SaveLoad, OverlappingOrIncompleteSlicesAreRefusedOnEveryRank) {
  testing::TempDir dir;
  const auto state = make_state(8);
  run_group(
      2, [](int) { return std::string("n0"); },
      [&](RankGroup& g) {
        Checkpointer ckpt(g, {.root = dir.path() + "/n0"});
        // Rank 1 sends rows 0..47 too: overlaps rank 0's without being identical.
        std::vector<OwnedSlice> mine = {test::cut(state[0], 0, 2, 0)};
        if (g.rank() == 1) mine[0] = test::cut(state[0], 0, 1, 0);
        auto v = test::views(mine);
        Status s = ckpt.save(1, v);
        EXPECT_EQ(s.code(), Code::kInvalidArgument) << s.to_string();
        EXPECT_NE(s.message().find("model.embed_tokens.weight"), std::string::npos) << s.message();
        // Only half of the tensor.
        std::vector<OwnedSlice> half = {test::cut(state[0], 0, 2, 0)};
        auto hv = test::views(half);
        s = ckpt.save(
            2, g.rank() == 0 ? std::span<const SliceView>(hv) : std::span<const SliceView>());
        EXPECT_EQ(s.code(), Code::kInvalidArgument) << s.to_string();
        EXPECT_NE(s.message().find("cover 1920 of its 3840 elements"), std::string::npos)
            << s.message();
      });
  EXPECT_FALSE(fs::exists(dir.path() + "/n0/step_1/COMMITTED"));
  EXPECT_FALSE(format::read_latest(dir.path() + "/n0").has_value());
}

TEST(SaveLoad, LoadAsksForUnknownTensorOrWrongShapeByName) {
  testing::TempDir dir;
  const auto state = make_state(9);
  save_state(dir.path(), state, 1, 1, 1);
  run_group(
      1, [](int) { return std::string("n0"); },
      [&](RankGroup& g) {
        Checkpointer ckpt(g, {.root = dir.path() + "/n0"});
        ASSERT_OK(ckpt.prepare_load());
        std::vector<std::byte> buf(16);
        MutableSliceView d{SliceSpec::whole("no.such.tensor", DType::kU8, {16}), buf};
        auto r = ckpt.load({&d, 1});
        EXPECT_EQ(r.status().code(), Code::kNotFound);
        EXPECT_NE(r.status().message().find("no.such.tensor"), std::string::npos);
      });
}

}  // namespace
}  // namespace ferry::checkpoint
