// The sender's half of delta rounds (docs/delta.md, "Delta rounds"): a host snapshot of what
// every receiver holds, and each round's tensors encoded against it as U8 blobs that travel
// as an ordinary round.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "ferry/status.h"
#include "ferry/sync.h"
#include "wire/message.h"

namespace ferry::sync {

// One round as the DeltaSender prepared it.
struct PreparedRound {
  bool delta = false;  // false: send the caller's tensors as a dense round
  // Later rounds may be deltas against this one (BEGIN's keep_for_delta): receivers in
  // callback modes keep a copy of it.
  bool keep_for_delta = true;
  // Delta: one U8 blob per tensor, named like it (parts point into the DeltaSender's
  // buffers or, for a dense-encoded tensor, [its header, the caller's bytes]).
  std::vector<GatheredTensor> blobs;
  std::vector<wire::DeltaTarget> targets;  // delta: what each blob decodes into
  std::uint64_t base_version = 0;
  std::uint64_t encoded_bytes = 0;
};

class DeltaSender {
 public:
  explicit DeltaSender(const SyncOptions& options);
  ~DeltaSender();
  DeltaSender(const DeltaSender&) = delete;
  DeltaSender& operator=(const DeltaSender&) = delete;

  // The next round goes dense: a new session, a receiver joined, or a round failed.
  void require_dense();
  // Every receiver acknowledged the round that left `version`.
  void acknowledged(std::uint64_t version) { base_version_ = version; }

  // Prepares a round of `tensors` and takes their bytes into the snapshot; a dense round's
  // copy runs beside the round until finish_round(), which must come before `tensors` go.
  // `all_peers_share_memory`: every peer maps the ring (Fanout::all_peers_share_memory), so
  // kAuto sends the round dense and keeps no snapshot: a dense round is then one copy, and
  // a delta's encode, apply and hashes cost more than the bytes it saves.
  Result<PreparedRound> prepare(std::span<const GatheredTensor> tensors,
                                bool all_peers_share_memory);
  void finish_round();

  // The sender's extra memory: the snapshot and the encode buffers.
  std::uint64_t memory_bytes() const;

 private:
  struct Entry {
    std::vector<std::byte> snapshot;  // empty: past delta_snapshot_limit, always dense
    std::vector<std::byte> encoded;   // this round's blob, reused round after round
    std::vector<std::byte> gathered;  // a tensor of several parts, made contiguous
    std::vector<std::byte> header;    // a dense blob's header before the caller's bytes
    bool valid = false;               // the snapshot holds what every receiver holds
  };
  Entry& entry_for(const TensorSpec& spec);
  bool mostly_changed(std::span<const GatheredTensor> tensors,
                      std::span<Entry* const> entries) const;
  std::uint32_t threads() const;

  SyncOptions options_;
  std::uint64_t base_version_ = 0;  // 0: the next round is dense
  std::uint64_t snapshot_bytes_ = 0;
  std::unordered_map<std::string, Entry> entries_;
  std::thread snapshot_copy_;  // a dense round's snapshot copy, beside the round
};

}  // namespace ferry::sync
