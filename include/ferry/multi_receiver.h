// Weight sync from several senders: when several trainer ranks each hold part of the weights,
// each serves its part as an ordinary Sender over its own session (ferry/sender_parts.h
// splits a model), and a MultiReceiver joins every one of them and receives the union:
//
//   auto rx = ferry::sync::MultiReceiver::connect({"@job42-rank0", "@job42-rank1"},
//                                                 /*receiver_id=*/0, options);
//   for (...) (*rx)->set_destination({spec, my_buffer});  // every tensor of every part
//   (*rx)->receive_round_into();                         // one round from every sender
//
// One round of a MultiReceiver is one round of every sender, received at once (a thread per
// sender, the caller's for the first): the k-th round of each since connect() pairs with the
// k-th of the others. Two rules are checked as each sender's BEGIN arrives, before any of that
// sender's tensors is delivered:
// - disjoint tensors: a name that two senders send in one round is kInvalidArgument naming the
//   tensor and both senders. The first sender's copy may already be written by then, as any
//   failed round in destination mode may leave destinations partly written;
// - the same more_follows (an update split into the same rounds) and the same step
//   (RoundOptions::step, or none), else kFailedPrecondition naming both senders.
// Round numbers (RoundStats::version) are not compared: each Sender counts its own, and after a
// failure they legitimately differ (a sender whose round went through fails its next one
// instead, so it counts one more), which would refuse every later session. ferry does not know
// the trainer's step; senders that must send the same step pair their rounds by sending them
// in lockstep.
// A round is OK only when every sender's round ended and checked out. Any error (a sender that
// dies or fails, a broken rule, a callback's error) fails the round naming the sender's
// address and aborts the other senders' rounds (each within about 100 ms, or once the net
// segment it is taking in arrives or options.timeout passes), and every session is closed,
// also those whose round went through: later calls return that first error. Connect anew; the
// senders' next accept() takes the new connection. Delta rounds work as with one sender.
//
// Thread safety: a MultiReceiver is used by one thread at a time. SyncOptions::interrupt is
// called from the senders' threads, one call at a time.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "ferry/export.h"
#include "ferry/status.h"
#include "ferry/sync.h"
#include "ferry/tensor.h"

namespace ferry::sync {

class FERRY_EXPORT MultiReceiver {
 public:
  // Connects to each address as Receiver::connect does, in order (shm "@name" or a path, net
  // "host:port", or a relay's local address), as `receiver_id` in every session.
  // kInvalidArgument for no address or one given twice.
  static Result<std::unique_ptr<MultiReceiver>> connect(const std::vector<std::string>& addresses,
                                                        std::uint32_t receiver_id,
                                                        const SyncOptions& options);
  ~MultiReceiver();
  MultiReceiver(const MultiReceiver&) = delete;
  MultiReceiver& operator=(const MultiReceiver&) = delete;

  // Destination mode, as Receiver's: where tensor `destination.spec.name` goes, whichever
  // sender sends it. Every tensor of a round needs one; those no sender sends are left alone.
  Status set_destination(MutableTensorView destination);
  // Rank-local destination mode, as Receiver's: only `slice`'s bytes of its tensor, whichever
  // sender sends it, go into `local`.
  Status set_destination(const TensorSlice& slice, std::span<std::byte> local);
  void clear_destinations();

  // One round from every sender into the destinations. RoundStats: tensors, buckets, bytes
  // and wire_bytes summed over the senders; seconds the whole round's; more_follows the one
  // they agreed on; round, version and base_version the first sender's (each sender's own in
  // sender_stats()); delta when any sender's round was one; checksum a hash of the senders'
  // round checksums in address order.
  Result<RoundStats> receive_round_into();
  // The same with per-tensor delivery; `on_tensor` is called from one thread at a time.
  Result<RoundStats> receive_round(const TensorCallback& on_tensor);
  // One whole update from every sender, with per-tensor delivery (`on_tensor` from one thread
  // at a time): each sender's rounds up to the one that says no more follow, so senders may
  // split an update into different numbers of rounds (Sender::send_update stages each part
  // in rounds of staging_bytes, and parts of different sizes take different numbers). The
  // rules, checked as each BEGIN arrives: every round of every sender carries the same step
  // (kFailedPrecondition naming both senders: no mixing of two updates), and no tensor is
  // sent by two senders in the update (kInvalidArgument naming it and both; one sender may
  // send a name again in a later round of its own, delivered after the first). A failure
  // ends every session as in receive_round. No sender's last round is acknowledged (its
  // send_update returns OK only then) until every sender's last round ended and its END
  // checked out here, so a sender that fails before then, even after all its tensors arrived,
  // fails the other senders' updates too (their last rounds abort naming it), not only this
  // receiver's. Only a sender lost while the ACKs go out can leave the others' updates
  // acknowledged and this one failed. RoundStats: tensors, buckets, bytes, wire_bytes summed
  // over every round of every sender; seconds the whole update's; more_follows false; round
  // and version the first sender's last round's. sender_stats() then holds each sender's
  // rounds summed the same way.
  Result<RoundStats> receive_update(const TensorCallback& on_tensor);
  // Receiver::set_min_step in every sender's session: a later round whose step is below
  // `step` is refused at its BEGIN (kFailedPrecondition), before any tensor is delivered.
  void set_min_step(std::uint64_t step);

  // Each sender's RoundStats of the last round that succeeded, in address order.
  std::span<const RoundStats> sender_stats() const;
  const std::vector<std::string>& addresses() const;

  struct Impl;

 private:
  explicit MultiReceiver(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace ferry::sync
