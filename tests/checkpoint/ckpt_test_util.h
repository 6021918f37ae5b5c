// Helpers for checkpoint tests: a deterministic state of global tensors, slicing
// it for a layout, and running the ranks of a group as threads.
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <mutex>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "checkpoint/slice.h"
#include "ferry/checkpoint.h"
#include "rank_group/group_test_util.h"
#include "support/test_support.h"

namespace ferry::checkpoint::test {

struct GlobalTensor {
  TensorSpec spec;
  std::vector<std::byte> data;
};

// Deterministic bytes: the same (seed, name, index) always gives the same byte.
inline std::vector<GlobalTensor> make_state(std::uint64_t seed) {
  std::vector<GlobalTensor> out;
  auto add = [&](std::string name, DType dtype, std::vector<std::int64_t> shape) {
    GlobalTensor t{{std::move(name), dtype, std::move(shape)}, {}};
    t.data.resize(t.spec.bytes());
    std::mt19937_64 rng(seed ^ std::hash<std::string>{}(t.spec.name));
    for (auto& b : t.data) b = static_cast<std::byte>(rng());
    out.push_back(std::move(t));
  };
  add("model.embed_tokens.weight", DType::kBF16, {96, 40});
  add("model.layers.0.self_attn.q_proj.weight", DType::kBF16, {40, 40});
  add("model.layers.0.self_attn.q_proj.bias", DType::kBF16, {40});
  add("model.layers.0.mlp.down_proj.weight", DType::kF32, {40, 72});
  add("model.norm.weight", DType::kF32, {40});
  add("lm_head.weight", DType::kBF16, {96, 40});
  add("odd.rows", DType::kI64, {3, 5});  // fewer rows than ranks: some ranks hold none
  return out;
}

// Rows [r*n/size, (r+1)*n/size) of dimension `dim` (dim 0 when the tensor has
// fewer dims), as one slice with its bytes.
struct OwnedSlice {
  SliceSpec spec;
  std::vector<std::byte> data;
};
inline OwnedSlice cut(const GlobalTensor& t, int rank, int size, int dim) {
  if (static_cast<std::size_t>(dim) >= t.spec.shape.size()) dim = 0;
  const std::int64_t n = t.spec.shape[dim];
  const std::int64_t b = n * rank / size, e = n * (rank + 1) / size;
  OwnedSlice s{SliceSpec::along(t.spec.name, t.spec.dtype, t.spec.shape, dim, b, e - b), {}};
  s.data.resize(s.spec.bytes());
  Box whole{std::vector<std::int64_t>(t.spec.shape.size(), 0), t.spec.shape};
  Box mine{s.spec.offset, s.spec.extent};
  if (mine.volume() > 0) {
    copy_region(mine, t.data, whole, s.data, mine,
                static_cast<std::size_t>(dtype_bits(t.spec.dtype) / 8));
  }
  return s;
}

inline std::vector<OwnedSlice> cut_all(const std::vector<GlobalTensor>& state, int rank, int size,
                                       int dim) {
  std::vector<OwnedSlice> out;
  for (const GlobalTensor& t : state) out.push_back(cut(t, rank, size, dim));
  return out;
}

inline std::vector<SliceView> views(const std::vector<OwnedSlice>& s) {
  std::vector<SliceView> v;
  for (const OwnedSlice& o : s) v.push_back({o.spec, o.data});
  return v;
}
inline std::vector<MutableSliceView> mutable_views(std::vector<OwnedSlice>& s) {
  std::vector<MutableSliceView> v;
  for (OwnedSlice& o : s) v.push_back({o.spec, o.data});
  return v;
}

using rank_group::test::Connect;
using rank_group::test::run_group;
using rank_group::test::unique_address;

// Saves `state` from `ranks` ranks over `nodes` nodes (roots <dir>/n<i>), split along dim 0.
inline void save_state(const std::string& dir, const std::vector<GlobalTensor>& state, int ranks,
                       int nodes, std::int64_t step, const std::string& common = R"({"lr":0.001})",
                       const Connect& connect = {}) {
  run_group(
      ranks, [&](int r) { return "n" + std::to_string(r * nodes / ranks); },
      [&](RankGroup& g) {
        Checkpointer ckpt(g, {.root = dir + "/" + g.node()});
        auto slices = cut_all(state, g.rank(), g.size(), 0);
        auto v = test::views(slices);
        Status s = ckpt.save(step, v, common);
        EXPECT_TRUE(s.ok()) << s.to_string();
      },
      connect);
}

struct LoadOutcome {
  std::int64_t step = -1;
  std::vector<std::string> notes;
  std::uint64_t local = 0, remote = 0;
};

// Loads with `ranks` ranks on `nodes` nodes, each rank its slices along `dim`,
// and checks every byte against `state`.
inline LoadOutcome load_and_check(const std::string& dir, const std::vector<GlobalTensor>& state,
                                  int ranks, int nodes, int dim,
                                  std::optional<std::int64_t> step = std::nullopt,
                                  const Connect& connect = {}) {
  LoadOutcome out;
  std::mutex mu;
  run_group(
      ranks, [&](int r) { return "n" + std::to_string(r * nodes / ranks); },
      [&](RankGroup& g) {
        Checkpointer ckpt(g, {.root = dir + "/" + g.node()});
        auto info = ckpt.prepare_load(step);
        ASSERT_TRUE(info.ok()) << info.status().to_string();
        std::vector<OwnedSlice> want = cut_all(state, g.rank(), g.size(), dim);
        std::vector<OwnedSlice> got = want;
        for (OwnedSlice& o : got) std::fill(o.data.begin(), o.data.end(), std::byte{0});
        auto dst = test::mutable_views(got);
        auto stats = ckpt.load(dst);
        ASSERT_TRUE(stats.ok()) << stats.status().to_string();
        for (std::size_t i = 0; i < want.size(); ++i) {
          EXPECT_EQ(testing::hash_bytes(got[i].data), testing::hash_bytes(want[i].data))
              << want[i].spec.to_string() << " on rank " << g.rank();
        }
        std::lock_guard<std::mutex> lock(mu);
        out.step = info->step;
        out.local += stats->local_bytes;
        out.remote += stats->remote_bytes;
        out.notes.insert(out.notes.end(), info->notes.begin(), info->notes.end());
      },
      connect);
  return out;
}

inline std::uint64_t state_bytes(const std::vector<GlobalTensor>& state) {
  std::uint64_t n = 0;
  for (const GlobalTensor& t : state) n += t.data.size();
  return n;
}

// A rank group that passes every call to `inner`: tests that play a faulty or hostile peer
// derive from it and override only the call they change.
class ForwardingGroup : public RankGroup {
 public:
  explicit ForwardingGroup(RankGroup& inner) : inner_(inner) {}
  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  const std::string& node() const override { return inner_.node(); }
  Result<std::vector<std::string>> all_gather(std::string_view mine) override {
    return inner_.all_gather(mine);
  }
  Result<std::string> broadcast(std::string_view data, int root) override {
    return inner_.broadcast(data, root);
  }
  Status barrier() override { return inner_.barrier(); }
  Result<std::string> fetch(int peer, std::string_view request) override {
    return inner_.fetch(peer, request);
  }
  Status fetch_into(int peer, std::string_view request, std::span<std::byte> out) override {
    return inner_.fetch_into(peer, request, out);
  }
  void set_fetch_handler(FetchHandler handler) override {
    inner_.set_fetch_handler(std::move(handler));
  }

 protected:
  RankGroup& inner_;
};

}  // namespace ferry::checkpoint::test
