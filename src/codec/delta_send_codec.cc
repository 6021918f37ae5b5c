#include <fmt/format.h>
#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <thread>
#include <unordered_set>

#include "codec/delta_codec.h"
#include "codec/registry.h"
#include "codec/testing.h"
#include "delta/delta.h"
#include "delta/format.h"

namespace ferry::codec {

using sync::DeltaMode;
using sync::GatheredTensor;

namespace {

testing::CorruptDelta& corrupt_delta_hook() {
  static testing::CorruptDelta hook;
  return hook;
}
testing::SkewDeltaBase& skew_delta_base_hook() {
  static testing::SkewDeltaBase hook;
  return hook;
}

// kAuto sends a round dense when its delta would exceed this fraction of the dense bytes.
constexpr double kAutoDenseFraction = 0.9;
// ... and skips encoding when a sample says more than this fraction of 8-byte words
// changed (10% of bf16 elements changes ~34% of words): the codec then encodes and applies
// at a fraction of memcpy speed (docs/benchmarks.md), slower than a dense round on shm.
constexpr double kAutoChangedWords = 0.25;
constexpr std::size_t kSampleBytes = 4096;
// The snapshot is updated by applying the delta when it is below 1/this of the tensor.
constexpr std::size_t kApplyToSnapshotBelow = 128;
constexpr std::size_t kSamplesPerTensor = 4;

// Calls work(i) for i in [0, n) on `threads` threads, biggest-first order left to the caller.
template <class Work>
void parallel_for(std::size_t n, std::uint32_t threads, Work&& work) {
  std::atomic<std::size_t> next{0};
  auto run = [&] {
    for (std::size_t i = next++; i < n; i = next++) work(i);
  };
  std::vector<std::thread> pool;
  const std::size_t extra =
      std::min<std::size_t>(threads, n) > 0 ? std::min<std::size_t>(threads, n) - 1 : 0;
  pool.reserve(extra);
  for (std::size_t t = 0; t < extra; ++t) pool.emplace_back(run);
  run();
  for (std::thread& t : pool) t.join();
}

// The tensor's bytes in one span: its only part, or `scratch` filled from its parts.
std::span<const std::byte> contiguous(const GatheredTensor& t, std::vector<std::byte>* scratch) {
  if (t.parts.size() == 1) return t.parts[0];
  std::size_t non_empty = 0;
  std::span<const std::byte> only;
  for (const auto& part : t.parts) {
    if (!part.empty()) {
      ++non_empty;
      only = part;
    }
  }
  if (non_empty <= 1) return only;
  scratch->resize(t.spec.bytes());
  std::size_t at = 0;
  for (const auto& part : t.parts) {
    std::memcpy(scratch->data() + at, part.data(), part.size());
    at += part.size();
  }
  return *scratch;
}

}  // namespace

DeltaSendCodec::DeltaSendCodec(const DeltaCodecOptions& options) : options_(options) {}

DeltaSendCodec::~DeltaSendCodec() { await_snapshot_copy(); }

void DeltaSendCodec::await_snapshot_copy() {
  if (snapshot_copy_.joinable()) snapshot_copy_.join();
}

void DeltaSendCodec::round_sent(bool ok, std::uint64_t version) {
  await_snapshot_copy();  // it reads the caller's tensors
  if (ok) {
    base_version_ = version;
  } else {
    reset();
  }
}

void DeltaSendCodec::reset() {
  base_version_ = 0;
  for (auto& [name, e] : entries_) e.valid = false;
}

std::uint32_t DeltaSendCodec::threads() const {
  if (options_.threads > 0) return options_.threads;
  return std::clamp<std::uint32_t>(std::thread::hardware_concurrency(), 1, 4);
}

DeltaSendCodec::Entry& DeltaSendCodec::entry_for(const TensorSpec& spec) {
  Entry& e = entries_[spec.name];
  const std::uint64_t bytes = spec.bytes();
  if (e.snapshot.size() != bytes) {
    snapshot_bytes_ -= e.snapshot.size();
    e.snapshot = {};
    e.valid = false;
    if (bytes <= options_.snapshot_limit - snapshot_bytes_) {
      e.snapshot.resize(bytes);
      snapshot_bytes_ += bytes;
    }
  }
  return e;
}

bool DeltaSendCodec::mostly_changed(std::span<const GatheredTensor> tensors,
                                    std::span<Entry* const> entries) const {
  std::uint64_t words = 0;
  std::uint64_t changed = 0;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const Entry& e = *entries[i];
    if (!e.valid || tensors[i].parts.size() != 1) continue;
    const std::span<const std::byte> now = tensors[i].parts[0];
    const std::size_t piece = std::min(kSampleBytes, now.size());
    if (piece == 0) continue;
    const std::size_t stride = (now.size() - piece) / kSamplesPerTensor;
    for (std::size_t k = 0; k < kSamplesPerTensor; ++k) {
      const std::size_t at = k * stride;
      changed += delta::count_differing_words(std::span(e.snapshot).subspan(at, piece),
                                              now.subspan(at, piece));
      words += (piece + 7) / 8;
      if (stride == 0) break;
    }
  }
  return words > 0 && static_cast<double>(changed) > kAutoChangedWords * static_cast<double>(words);
}

Result<EncodedRound> DeltaSendCodec::encode(std::span<const GatheredTensor> tensors,
                                            bool all_peers_share_memory) {
  await_snapshot_copy();
  EncodedRound round;
  if (options_.mode == DeltaMode::kAuto && all_peers_share_memory) {
    // No link to save bytes on. Peers only change through accept(), which asks for a dense
    // round; should a delta come anyway, tensors without a valid snapshot go dense-encoded.
    for (auto& [name, e] : entries_) e.valid = false;
    return round;
  }
  std::vector<Entry*> entries;
  entries.reserve(tensors.size());
  std::unordered_set<std::string_view> names;
  std::uint64_t dense_bytes = 0;
  for (const GatheredTensor& t : tensors) {
    std::uint64_t given = 0;
    for (const auto& part : t.parts) given += part.size();
    if (given != t.spec.bytes()) {
      return invalid_argument(fmt::format("tensor '{}': {} bytes given, {} needs {}", t.spec.name,
                                          given, t.spec.to_string(), t.spec.bytes()));
    }
    // Checked here, not only by send_round: two tensors of one name would share an entry.
    if (!names.insert(t.spec.name).second) {
      return invalid_argument(fmt::format("tensor '{}' appears twice in the round", t.spec.name));
    }
    entries.push_back(&entry_for(t.spec));
    dense_bytes += given;
  }
  round.keep_copies = true;
  const bool encoded = base_version_ != 0 &&
                       !(options_.mode == DeltaMode::kAuto && mostly_changed(tensors, entries));
  if (!encoded) {
    // Dense: the snapshot takes the new bytes, which receivers will hold, on one thread
    // beside the round (round_sent() waits): the round itself then costs what a dense
    // round without delta costs, as long as a core is free.
    std::vector<std::pair<std::span<std::byte>, const GatheredTensor*>> copies;
    for (std::size_t i = 0; i < tensors.size(); ++i) {
      Entry& e = *entries[i];
      if (e.snapshot.empty()) continue;
      copies.emplace_back(e.snapshot, &tensors[i]);
      e.valid = true;
    }
    snapshot_copy_ = std::thread([copies = std::move(copies)] {
      for (const auto& [into, t] : copies) {
        std::size_t at = 0;
        for (const auto& part : t->parts) {
          std::memcpy(into.data() + at, part.data(), part.size());
          at += part.size();
        }
      }
    });
    return round;
  }
  round.codec = kDeltaId;
  round.base_version = base_version_;
  if (skew_delta_base_hook()) round.base_version = skew_delta_base_hook()(round.base_version);
  round.payloads.resize(tensors.size());
  round.targets.resize(tensors.size());
  Status failed;
  std::atomic<bool> any_failed{false};
  parallel_for(tensors.size(), threads(), [&](std::size_t i) {
    Entry& e = *entries[i];
    const GatheredTensor& t = tensors[i];
    const std::span<const std::byte> now = contiguous(t, &e.gathered);
    GatheredTensor& payload = round.payloads[i];
    round.targets[i] = wire::CodecTarget{t.spec, XXH3_64bits(now.data(), now.size())};
    bool updated = false;  // the snapshot holds `now`
    if (e.valid) {
      Status s = delta::encode_into(e.snapshot, now, {}, &e.encoded);
      if (!s.ok()) {
        if (!any_failed.exchange(true)) failed = s.with_context("tensor '" + t.spec.name + "'");
        return;
      }
      // A very sparse delta brings the snapshot up to date faster than copying the tensor
      // (apply runs at 2x memcpy at 0.1% changed, below it from ~1%: docs/benchmarks.md).
      if (e.encoded.size() < now.size() / kApplyToSnapshotBelow &&
          delta::apply(e.encoded, e.snapshot, t.spec.name).ok()) {
        updated = true;
      }
      if (corrupt_delta_hook()) corrupt_delta_hook()(t.spec.name, &e.encoded);
      payload.parts = {e.encoded};
    } else {
      // No base to encode against: the dense encoding, its header before the caller's bytes.
      delta::Header header;
      header.encoding = delta::Encoding::kDense;
      header.segment_bytes = now.size();
      header.body_bytes = now.size();
      e.header.resize(delta::kHeaderBytes);
      delta::write_header(header, now, e.header.data());
      payload.parts = {e.header, now};
    }
    if (!e.snapshot.empty() && !updated) std::memcpy(e.snapshot.data(), now.data(), now.size());
    e.valid = !e.snapshot.empty();
  });
  if (any_failed) {
    reset();
    return failed;
  }
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    std::uint64_t n = 0;
    for (const auto& part : round.payloads[i].parts) n += part.size();
    round.payloads[i].spec =
        *TensorSpec::make(tensors[i].spec.name, DType::kU8, {static_cast<std::int64_t>(n)});
    round.encoded_bytes += n;
  }
  if (options_.mode == DeltaMode::kAuto &&
      static_cast<double>(round.encoded_bytes) >
          kAutoDenseFraction * static_cast<double>(dense_bytes)) {
    // Dense after all; the snapshot already holds the new bytes.
    round.codec = wire::kDense;
    round.base_version = 0;
    round.payloads.clear();
    round.targets.clear();
  }
  return round;
}

void testing::set_corrupt_delta_hook(CorruptDelta hook) { corrupt_delta_hook() = std::move(hook); }
void testing::set_skew_delta_base_hook(SkewDeltaBase hook) {
  skew_delta_base_hook() = std::move(hook);
}

}  // namespace ferry::codec
