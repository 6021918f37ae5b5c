// A Sender's session, shared by sender.cc (its rounds) and send_update.cc (the update policy
// over them): the fanout of its peers, the round writer, and what breaks the session.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "base/status_macros.h"
#include "codec/tensor_codec.h"
#include "ferry/status.h"
#include "ferry/sync.h"
#include "profiler/span.h"
#include "sync/fanout.h"
#include "sync/round_writer.h"
#include "wire/message.h"

namespace ferry::sync {

struct Sender::Impl {
  SyncOptions options;
  std::unique_ptr<Fanout> fanout;
  std::unique_ptr<RoundWriter> writer;
  Status broken;                            // the first error; the session is unusable after it
  std::unique_ptr<codec::SendCodec> codec;  // null: rounds go dense
  // send_update: the manifest of the last update sent whole with unique names, which the
  // next one streams against; the staging buffer of staged updates.
  std::optional<std::vector<TensorSpec>> learned;
  std::unique_ptr<std::byte[]> staging;
  std::uint64_t staging_bytes = 0;
  UpdateWriter::Impl* open_update = nullptr;  // the update writing to this Sender, if any

  // A round may start: the session is intact and has a receiver.
  Status ready() const {
    if (!broken.ok()) {
      return failed_precondition(
          "the session failed earlier (accept() receivers again to start a new one): " +
          broken.to_string());
    }
    FERRY_RETURN_IF_ERROR(no_open_update());
    if (fanout->peers().empty()) return failed_precondition("send_round: no receiver has joined");
    return ok_status();
  }

  // Nothing but the open update, if any, may use the session.
  Status no_open_update() const {
    if (open_update == nullptr) return ok_status();
    return failed_precondition(
        "an update (UpdateWriter) is open on this Sender: finish or abort it first");
  }

  Status fail(Status why) {
    if (broken.ok()) broken = why;
    learned.reset();
    return fanout->fail(why);
  }

  // One round: BEGIN, `put_all` packing its bytes through the writer, END and the ACKs. A
  // manifest that cannot be planned fails before BEGIN, leaving the session intact; any later
  // error breaks it.
  template <class PutAll>
  Result<RoundStats> send(Result<std::vector<TensorSpec>> manifest,
                          const RoundOptions& round_options, PutAll&& put_all,
                          wire::Begin fields = {}) {
    profiler::Span round_span("sync.send_round");
    if (!manifest.ok()) return manifest.status();
    const std::uint64_t before = writer->round();
    Status s = writer->begin(std::move(*manifest), round_options, std::move(fields));
    if (!s.ok()) return writer->round() == before ? s : fail(s);
    s = put_all(*writer);
    if (!s.ok()) return fail(s);
    auto stats = writer->finish();
    if (!stats.ok()) return fail(stats.status());
    return stats;
  }

  // A round of the caller's views (through the codec, if any).
  Result<RoundStats> send_views(std::span<const TensorView> weights,
                                const RoundOptions& round_options);
  // A round through the codec, which sends it dense or as encoded payloads.
  Result<RoundStats> send_encoded(std::span<const GatheredTensor> tensors,
                                  const RoundOptions& round_options);
};

// Aborts the update open on `sender`, if any: the Sender is going away.
void abort_open_update(Sender::Impl* sender);

}  // namespace ferry::sync
