// The receiving end of a session's rounds as an object its caller drives: begin() takes a
// round's BEGIN, next() hands out each verified segment, release() returns a bucket's slot to
// the sender, and the END's digest and the ACK close the round. Receiver's delivery modes
// (destinations, tensor and bucket callbacks, writable views) are small loops over it.
//
//   RoundReader& r = ...;
//   FERRY_RETURN_IF_ERROR(r.begin(ReadInto::kViews).status());
//   while (true) {
//     auto s = r.next();                        // a verified segment, or nullopt at END
//     if (!s.ok()) return s.status();           // the session is broken; the sender told
//     if (!*s) return r.stats();                // the round arrived whole and was ACKed
//     use((*s)->tensors);
//     if ((*s)->bucket_ends) FERRY_RETURN_IF_ERROR(r.release((*s)->bucket));
//   }
//
// Any error (from the reader, or the caller's through abort()) breaks the session as
// Receiver's header says: the sender is told, later calls fail with the first error.
//
// A relay reads kPassThrough: segments are received and verified but not delivered, and it
// forwards each message() as it came; it releases buckets as its own peers do, polls with
// message_waiting() between serving them, and acknowledge()s once they all acknowledged.
#pragma once

#include <algorithm>
#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "base/uninit_buffer.h"
#include "codec/tensor_codec.h"
#include "ferry/status.h"
#include "ferry/sync.h"
#include "ferry/tensor.h"
#include "sync/bucket_planner.h"
#include "sync/copy.h"
#include "sync/kept_copies.h"
#include "sync/link.h"
#include "sync/round_checksum.h"
#include "sync/segment.h"
#include "sync/sync_options.h"
#include "transport/ring.h"
#include "transport/transport.h"
#include "wire/conversation.h"
#include "wire/message.h"

namespace ferry::sync {

// What a round's verified END tells an EndCheck.
struct RoundEnd {
  std::uint64_t round = 0;  // the sender's round number
  bool more_follows = false;
};
// Called once a round's END is verified, before its ACK is sent; an error aborts the round as
// any error does, so the sender's round fails too (MultiReceiver's barrier before the last
// rounds of an update are acknowledged).
using EndCheck = std::function<Status(const RoundEnd& end)>;

class RoundReader {
 public:
  // `ring`: mapped from a sender that shares memory, else this process's own, registered as
  // `region` for the segments sent into it.
  RoundReader(const SyncOptions& options, Link link, wire::Conversation conversation,
              std::unique_ptr<transport::Ring> ring, std::unique_ptr<transport::Region> region,
              bool checksums);
  ~RoundReader();
  RoundReader(const RoundReader&) = delete;
  RoundReader& operator=(const RoundReader&) = delete;

  // Waits (options.idle_timeout) for the next round's BEGIN, checks it (set_begin_check, the
  // codec and its base version, the limits of copies and assembly) and plans its buckets.
  Result<RoundBegin> begin(ReadInto into);
  // kDestinations: where tensor i of begin()'s RoundBegin::tensors goes; after begin(), before
  // next(); the memory stays valid and holds the tensor's bytes, or where `slices` (empty, or
  // one per tensor) has a slice, the slice's local bytes: only the bytes its runs select are
  // copied. An encoded round cannot go into slices (kFailedPrecondition).
  Status into(std::span<std::byte* const> destinations,
              std::span<const TensorSlice* const> slices = {});
  // The next verified segment; nullopt once the round's END matched every bucket (the ACK is
  // sent, stats() holds the round). Buckets still held are released first.
  Result<std::optional<ReadSegment>> next();
  // Hands bucket `bucket`'s slot back to the sender: its views end. In bucket order.
  Status release(std::uint32_t bucket);
  // Breaks the session with the caller's reason ("round N aborted: ..." inside a round).
  Status abort(Status why);

  // kPassThrough: true when the sender's next message has arrived (next() will not wait).
  Result<bool> message_waiting();
  // kPassThrough: the message next() or begin() just read, as received and as decoded (a
  // BEGIN without its manifest), for a relay to forward unchanged.
  const std::vector<std::byte>& message_bytes() const { return message_bytes_; }
  const wire::Message& message() const { return message_; }
  // kPassThrough, after next() returned the END: the ACK (every bucket released first).
  Status acknowledge();
  // The END's digest, once next() returned nullopt.
  std::uint64_t round_checksum() const { return digest_; }

  // Errors this end reports start with `name` ("relay 3: ...").
  void set_name(std::string name) { name_ = std::move(name); }

  // OK, or the error that broke the session.
  const Status& status() const { return broken_; }
  // Between begin() and the round's end (next()'s nullopt; a relay's acknowledge()).
  bool in_round() const { return in_round_; }
  void set_begin_check(BeginCheck check) { begin_check_ = std::move(check); }
  void set_end_check(EndCheck check) { end_check_ = std::move(check); }
  // Refuses, from the next BEGIN on, a round whose step is below `step` (Receiver::set_min_step).
  void set_min_step(std::uint64_t step) { min_step_ = std::max(min_step_.value_or(0), step); }
  // Bumped whenever a round's tensors differ from the last round's, so a caller resolving
  // destinations by name does so once per change.
  std::uint64_t tensors_generation() const { return tensors_generation_; }
  const RoundStats& stats() const { return stats_; }
  // OK when kWritableViews can run (2 slots or more, page-sized buckets, a private mapping).
  Status writable_views_error();
  std::span<const std::byte> ring_memory() const;
  std::uint64_t session_id() const { return conversation_.session(); }
  std::uint64_t last_round() const { return conversation_.round(); }
  const std::string& peer() const { return link_.peer(); }
  bool checksums() const { return checksums_; }
  transport::Ring& ring() { return *ring_; }
  const transport::Ring& ring() const { return *ring_; }
  // The link's wait loop (a relay waits on it beside its own peers).
  std::unique_ptr<transport::Poller> poller() { return link_.channel().poller(); }
  // What a receive loop polls for the sender's link beside the poller (Link::poll_fd).
  int poll_fd() const { return link_.poll_fd(); }

 private:
  struct Lease {
    std::uint32_t bucket = 0;
    std::uint32_t slot = 0;
    UninitBuffer assembled;  // a split tensor that completed in this bucket
  };

  Status check_session() const;
  std::span<const TensorSpec> round_tensors() const {
    return encoded_ ? std::span<const TensorSpec>(targets_)
                    : std::span<const TensorSpec>(manifest_);
  }
  Result<wire::Message> receive_message(std::chrono::milliseconds timeout);
  Status begin_round(wire::Message first, ReadInto into);
  Status check_codec(const wire::Begin& begin, std::uint64_t round);
  Status check_assembly(std::uint64_t round) const;
  Result<std::optional<ReadSegment>> next_segment();
  Status end_round(const wire::End& end);
  Status send_ack();
  void await_hangup();
  Status sender_reason(Status why);
  Status receive_segment(const wire::Filled& f);
  Status verify_and_deliver(const wire::Filled& f, const std::byte* slot);
  Status deliver(const wire::Filled& f, const std::byte* slot, BucketHash* hash);
  Status finish_tensor(std::size_t i, TensorView tensor, std::byte* writable);
  Status decode(const wire::CodecTarget& target, std::span<const std::byte> payload,
                std::span<std::byte> onto) const;
  Status send_release(const Lease& lease);
  void start_forgetting(std::uint32_t slot);
  Status forgotten(std::uint32_t slot);

  SyncOptions options_;
  InterruptCheck interrupted_;
  Link link_;
  wire::Conversation conversation_;
  std::unique_ptr<transport::Ring> ring_;           // never null
  std::unique_ptr<transport::Region> ring_region_;  // after ring_: deregistered first
  bool checksums_ = true;
  Status broken_;
  std::string name_;
  BeginCheck begin_check_;
  EndCheck end_check_;
  // The lowest step a round may carry: the highest of the steps received and set_min_step's.
  std::optional<std::uint64_t> min_step_;
  KeptCopies copies_;
  std::uint64_t held_version_ = 0;  // the version the last round left; 0: none known

  // The round being read.
  bool in_round_ = false;
  bool sender_error_ = false;  // the sender's ERROR was decoded (nothing is read after it)
  ReadInto into_ = ReadInto::kViews;
  // An encoded round: its payloads are assembled and decoded onto destinations or copies by
  // codec_ (null when passing the round through).
  bool encoded_ = false;
  const codec::ReceiveCodec* codec_ = nullptr;
  bool more_follows_ = false;
  std::chrono::steady_clock::time_point start_;
  std::optional<RoundChecksum> round_sum_;
  std::vector<TensorSpec> manifest_;
  std::uint64_t plan_bucket_bytes_ = 0;
  BucketPlan plan_;
  wire::Begin fields_;               // the round's BEGIN, its manifest moved out
  std::vector<TensorSpec> targets_;  // an encoded round's tensors (its manifest: payloads)
  std::uint64_t tensors_generation_ = 0;
  std::span<std::byte* const> destinations_;
  std::span<const TensorSlice* const> slices_;  // empty, or per tensor (null: the whole tensor)
  std::uint64_t delivered_bytes_ = 0;           // copied into destinations this round
  RoundStats stats_;
  bool ended_ = false;  // END checked
  std::uint64_t digest_ = 0;
  std::optional<std::vector<std::byte>> waiting_;  // message_waiting()'s, not yet read
  std::vector<std::byte> message_bytes_;           // kPassThrough: the last message read
  wire::Message message_;

  SegmentWalker walker_{{}};
  UninitBuffer staging_;             // a tensor split across buckets, being assembled
  std::vector<UninitBuffer> spare_;  // released assemblies, reused (no page faults)
  std::deque<Lease> leases_;         // buckets delivered, not yet released
  std::vector<TensorView> views_;
  std::vector<MutableTensorView> writable_views_;

  // kWritableViews: the ring's copy-on-write view (mapped on first use, or why not). A released
  // slot is sealed read-only and the pages the caller wrote into its views are dropped (a
  // pagemap scan, ~15 ms per 512 MiB, in the background) before the slot's views are handed
  // out again, unsealed (mprotect, ~4 ms per 512 MiB); the round's last bucket,
  // whose views stay readable until the sender refills the slot, when the next round begins.
  std::unique_ptr<transport::WritableView> cow_;
  std::optional<Status> cow_error_;
  std::vector<bool> writes_to_forget_;           // per slot: released, not yet scanned
  std::vector<std::future<Status>> forgetting_;  // per slot: the scan running; after cow_
};

// The reader `receiver` drives (receiver.cc), for hooks that are not Receiver's public API:
// MultiReceiver's set_end_check.
RoundReader& reader_of(Receiver& receiver);

}  // namespace ferry::sync
