// Shared pieces of the sync tests: deterministic tensors and unique addresses.
#pragma once

#include <dirent.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "base/status_macros.h"
#include "ferry/sync.h"
#include "ferry/tensor.h"

namespace ferry::sync::testing {

// Owns the bytes of a list of tensors filled from (seed, round).
struct Weights {
  std::vector<TensorSpec> specs;
  std::vector<std::vector<std::byte>> data;

  std::vector<TensorView> views() const {
    std::vector<TensorView> v;
    for (std::size_t i = 0; i < specs.size(); ++i) v.push_back({specs[i], data[i]});
    return v;
  }
};

inline std::byte pattern(std::uint64_t seed, std::size_t tensor, std::size_t i) {
  std::uint64_t x = seed * 0x9E3779B97F4A7C15ULL + tensor * 0xBF58476D1CE4E5B9ULL + i;
  x ^= x >> 31;
  x *= 0x94D049BB133111EBULL;
  return static_cast<std::byte>(x >> 56);
}

inline Weights make_weights(const std::vector<TensorSpec>& specs, std::uint64_t seed) {
  Weights w;
  w.specs = specs;
  for (std::size_t t = 0; t < specs.size(); ++t) {
    std::vector<std::byte> d(specs[t].bytes());
    for (std::size_t i = 0; i < d.size(); ++i) d[i] = pattern(seed, t, i);
    w.data.push_back(std::move(d));
  }
  return w;
}

// A small model: a tensor much larger than the test bucket, odd sizes, mixed dtypes.
// Writes bytes [offset, offset + dst.size()) of tensor `index` of a round into `dst`, or
// only starts that copy (a device's asynchronous D2H), completed by the round's flush.
using RoundProducer =
    std::function<Status(std::size_t index, std::uint64_t offset, std::span<std::byte> dst)>;

// One round to `sender` whose tensors `produce` writes into the ring itself, as a device's
// copies do: UpdateWriter::begin_round, put(spec, producer) per tensor, finish.
inline Result<RoundStats> send_produced(Sender& sender, const std::vector<TensorSpec>& specs,
                                        const RoundProducer& produce, FillFlush flush) {
  Sender* target = &sender;
  FERRY_ASSIGN_OR_RETURN(std::unique_ptr<UpdateWriter> writer,
                         UpdateWriter::begin_round(target, specs, {}, std::move(flush)));
  for (std::size_t i = 0; i < specs.size(); ++i) {
    FERRY_RETURN_IF_ERROR(writer->put(
        specs[i],
        [&](std::uint64_t offset, std::span<std::byte> dst) { return produce(i, offset, dst); }));
  }
  FERRY_ASSIGN_OR_RETURN(std::vector<UpdateStats> stats, writer->finish());
  return stats.front().last_round;
}

inline std::vector<TensorSpec> small_model() {
  return {*TensorSpec::make("model.embed_tokens.weight", DType::kF32, {64, 37}),
          *TensorSpec::make("model.layers.0.input_layernorm.weight", DType::kBF16, {37}),
          *TensorSpec::make("model.layers.0.self_attn.q_proj.bias", DType::kF16, {3}),
          *TensorSpec::make("model.layers.0.packed", DType::kF4, {10}),
          *TensorSpec::make("model.empty", DType::kF32, {0}),
          *TensorSpec::make("model.norm.weight", DType::kF64, {5, 3}),
          *TensorSpec::make("lm_head.weight", DType::kBF16, {41, 37})};
}

inline std::string unique_address() {
  static std::atomic<int> n{0};
  return "@ferry-test-" + std::to_string(::getpid()) + "-" + std::to_string(n++);
}

inline int open_fd_count() {
  int n = 0;
  DIR* d = ::opendir("/proc/self/fd");
  while (dirent* e = ::readdir(d)) n += e->d_name[0] != '.';
  ::closedir(d);
  return n - 1;  // the DIR's own descriptor
}

inline SyncOptions tiny_options() {
  SyncOptions o;
  o.bucket_bytes = 256;  // a tensor of 9 KB spans ~37 buckets
  o.slots = 2;
  o.timeout = std::chrono::milliseconds(10'000);
  return o;
}

}  // namespace ferry::sync::testing
