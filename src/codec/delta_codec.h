// Delta rounds (docs/delta.md, "Delta rounds") as a codec: the sender keeps a host snapshot
// of what every receiver holds and encodes each round's tensors against it as U8 payloads;
// a receiver applies each payload onto the tensor's bytes at the base version.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "codec/tensor_codec.h"
#include "ferry/status.h"
#include "ferry/sync.h"

namespace ferry::codec {

// The sender's delta settings (SyncOptions::delta, delta_snapshot_limit, delta_threads).
struct DeltaCodecOptions {
  sync::DeltaMode mode = sync::DeltaMode::kOn;
  std::uint64_t snapshot_limit = UINT64_MAX;
  std::uint32_t threads = 0;  // 0: hardware concurrency, at most 4
};

class DeltaSendCodec final : public SendCodec {
 public:
  explicit DeltaSendCodec(const DeltaCodecOptions& options);
  ~DeltaSendCodec() override;
  DeltaSendCodec(const DeltaSendCodec&) = delete;
  DeltaSendCodec& operator=(const DeltaSendCodec&) = delete;

  // Takes the round's bytes into the snapshot as it encodes them. A round that goes dense
  // is copied into the snapshot on a thread beside the round, until round_sent(). With
  // `all_peers_share_memory`, kAuto sends the round dense and keeps no snapshot: a dense
  // round is then one copy, and a delta's encode, apply and hashes cost more than the bytes
  // it saves.
  Result<EncodedRound> encode(std::span<const sync::GatheredTensor> tensors,
                              bool all_peers_share_memory) override;
  void round_sent(bool ok, std::uint64_t version) override;
  void reset() override;

 private:
  struct Entry {
    std::vector<std::byte> snapshot;  // empty: past delta_snapshot_limit, always dense
    std::vector<std::byte> encoded;   // this round's payload, reused round after round
    std::vector<std::byte> gathered;  // a tensor of several parts, made contiguous
    std::vector<std::byte> header;    // a dense payload's header before the caller's bytes
    bool valid = false;               // the snapshot holds what every receiver holds
  };
  Entry& entry_for(const TensorSpec& spec);
  bool mostly_changed(std::span<const sync::GatheredTensor> tensors,
                      std::span<Entry* const> entries) const;
  std::uint32_t threads() const;
  void await_snapshot_copy();

  DeltaCodecOptions options_;
  std::uint64_t base_version_ = 0;  // 0: the next round is dense
  std::uint64_t snapshot_bytes_ = 0;
  std::unordered_map<std::string, Entry> entries_;
  std::thread snapshot_copy_;  // a dense round's snapshot copy, beside the round
};

class DeltaReceiveCodec final : public ReceiveCodec {
 public:
  std::string_view name() const override { return "delta"; }
  bool decodes_onto_base() const override { return true; }
  Status decode(std::span<const std::byte> payload, std::span<std::byte> onto,
                std::string_view what) const override;
};

}  // namespace ferry::codec
