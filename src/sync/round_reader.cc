#include "sync/round_reader.h"

#include <fmt/format.h>
#include <xxhash.h>

#include "base/clock.h"
#include "base/status_macros.h"
#include "codec/registry.h"
#include "profiler/span.h"
#include "sync/copy.h"
#include "sync/round_stats.h"

namespace ferry::sync {
namespace {

// Messages a reader that gave up reads past, looking for the sender's ERROR behind them: far
// more than the FILLEDs of a round's slots.
constexpr int kMaxUnreadMessages = 4096;

}  // namespace

RoundReader::RoundReader(const SyncOptions& options, Link link, wire::Conversation conversation,
                         std::unique_ptr<transport::Ring> ring,
                         std::unique_ptr<transport::Region> region, bool checksums)
    : options_(options),
      interrupted_(options),
      link_(std::move(link)),
      conversation_(std::move(conversation)),
      ring_(std::move(ring)),
      ring_region_(std::move(region)),
      checksums_(checksums),
      copies_(options.delta_keep_limit) {}

RoundReader::~RoundReader() = default;

Status RoundReader::check_session() const {
  if (broken_.ok()) return ok_status();
  return failed_precondition("the session failed earlier: " + broken_.to_string());
}

Status RoundReader::abort(Status why) {
  if (!broken_.ok()) return why;
  held_version_ = 0;
  // Not after a timeout (the sender stopped talking) or an interrupt (the caller wants out
  // now: Ctrl-C).
  const bool linger = why.code() != Code::kTimeout && !interrupted_.fired();
  if (in_round_ && into_ != ReadInto::kPassThrough) {  // a relay's reasons name the round
    // A send or receive that failed because the sender gave up: its ERROR may be waiting,
    // behind messages of the round this end had not read yet.
    if (why.code() == Code::kAborted && link_.valid()) why = sender_reason(std::move(why));
    why = Status(why.code(),
                 fmt::format("round {} aborted: {}", conversation_.round(), why.message()));
  }
  in_round_ = false;
  if (!name_.empty()) why = Status(why.code(), fmt::format("{}: {}", name_, why.message()));
  broken_ = why;
  if (link_.valid()) {
    // Best effort: the sender learns why this end gives up.
    const Status sent =
        link_.send(wire::encode(session_message(conversation_.session(), conversation_.round(),
                                                wire::Error{why.code(), why.message()})),
                   std::chrono::milliseconds(100));
    // Linger until the sender has read why (a sender that found the link closed first would
    // name only this end, not the reason), unless the sender is gone or stopped talking.
    if (linger && (sent.ok() || sent.code() == Code::kTimeout)) {
      await_hangup();
      link_.close();  // flushes the ERROR
    } else {
      link_.abort();
    }
  }
  return why;
}

// The sender's ERROR if it is among the messages waiting unread; else `why`.
Status RoundReader::sender_reason(Status why) {
  if (sender_error_) return why;  // `why` is the sender's ERROR itself
  for (int i = 0; i < kMaxUnreadMessages; ++i) {
    auto pending = receive_message(std::chrono::milliseconds(0));
    if (pending.ok()) continue;
    if (sender_error_) return pending.status();
    break;
  }
  return why;
}

// The longest a reader that gave up waits for the sender to read its ERROR.
constexpr std::chrono::milliseconds kReportDeliveryBound{5000};

// The sender ends the session (an ERROR to every peer, then it hangs up) once it has read a
// peer's ERROR. Bounded by kReportDeliveryBound (and the session's timeout), and by an
// interrupt (stop, Ctrl-C).
void RoundReader::await_hangup() {
  const Deadline deadline(std::min(options_.timeout, kReportDeliveryBound));
  while (!deadline.passed()) {
    auto got = link_.receive(wait_slice(options_, deadline.left()));
    if (got.ok()) {
      auto m = wire::decode(*got, link_.peer());
      if (!m.ok() || m->type() == wire::MessageType::kError) return;  // the sender ended it
      continue;  // the round's traffic, no longer wanted
    }
    if (got.status().code() != Code::kTimeout) return;  // hung up
    if (!interrupted_().ok()) return;
  }
}

Result<bool> RoundReader::message_waiting() {
  FERRY_RETURN_IF_ERROR(check_session());
  if (waiting_) return true;
  auto got = link_.try_receive(options_.timeout);
  if (!got.ok()) return abort(got.status());
  if (!got->has_value()) return false;
  waiting_ = std::move(**got);
  return true;
}

Result<wire::Message> RoundReader::receive_message(std::chrono::milliseconds timeout) {
  std::vector<std::byte> got;
  if (waiting_) {
    got = std::move(*waiting_);
    waiting_.reset();
  } else {
    FERRY_ASSIGN_OR_RETURN(got, receive_heeding_interrupt(link_, timeout, options_, interrupted_));
  }
  FERRY_ASSIGN_OR_RETURN(wire::Message m,
                         decode_from_sender(got, link_, conversation_, &sender_error_));
  if (into_ == ReadInto::kPassThrough) {
    message_bytes_ = std::move(got);
    // A BEGIN's manifest is forwarded in the bytes: not copied into message_.
    auto* begin = std::get_if<wire::Begin>(&m.body);
    std::vector<TensorSpec> manifest;
    if (begin != nullptr) manifest.swap(begin->manifest);
    message_ = m;
    if (begin != nullptr) begin->manifest.swap(manifest);
  }
  return m;
}

Result<RoundBegin> RoundReader::begin(ReadInto into) {
  FERRY_RETURN_IF_ERROR(check_session());
  if (into == ReadInto::kWritableViews) FERRY_RETURN_IF_ERROR(writable_views_error());
  into_ = into;
  auto first = receive_message(options_.idle_timeout);
  if (!first.ok()) return abort(first.status());
  in_round_ = true;
  Status s = begin_round(std::move(*first), into);
  if (!s.ok()) return abort(s);
  return RoundBegin{conversation_.round(), more_follows_, round_tensors(), fields_.step};
}

Status RoundReader::begin_round(wire::Message first, ReadInto into) {
  start_ = Clock::now();
  const std::uint64_t round = first.round;
  if (first.type() != wire::MessageType::kBegin) {
    return internal_error("conversation let a non-BEGIN message start a round");
  }
  round_sum_.emplace(wire::encode(first));
  auto& begin = std::get<wire::Begin>(first.body);
  into_ = into;
  encoded_ = begin.codec != wire::kDense;
  more_follows_ = begin.more_follows != 0;
  ended_ = false;
  leases_.clear();
  destinations_ = {};
  slices_ = {};
  delivered_bytes_ = 0;
  const bool was_encoded = fields_.codec != wire::kDense;
  // What the round delivers: an encoded round's targets, else its manifest (not copied).
  targets_.clear();
  if (encoded_) {
    for (const wire::CodecTarget& t : begin.targets) targets_.push_back(t.spec);
  }
  const std::span<const TensorSpec> tensors =
      encoded_ ? std::span<const TensorSpec>(targets_) : begin.manifest;
  if (begin.step && min_step_ && *begin.step < *min_step_) {
    return failed_precondition(
        fmt::format("stale weights: the sender sends step {}, but this receiver has or "
                    "requires step {}",
                    *begin.step, *min_step_));
  }
  if (begin_check_) {
    FERRY_RETURN_IF_ERROR(begin_check_(RoundBegin{round, more_follows_, tensors, begin.step}));
  }
  codec_ = nullptr;
  if (encoded_ && into != ReadInto::kPassThrough) FERRY_RETURN_IF_ERROR(check_codec(begin, round));
  // Views of encoded rounds and of keep_copies rounds need copies sized by BEGIN: bounded
  // before any is made.
  const bool views = into == ReadInto::kViews || into == ReadInto::kWritableViews;
  if (views && (encoded_ || begin.keep_copies != 0)) {
    FERRY_RETURN_IF_ERROR(copies_.check(begin, round));
  }
  if (encoded_ && into == ReadInto::kWritableViews) {
    return failed_precondition(
        fmt::format("round {} is a {} round: writable views cannot be given for it (the "
                    "views would be the copies its payloads decode onto); receive it with "
                    "receive_round_buckets",
                    round, codec_->name()));
  }
  if (into == ReadInto::kWritableViews) {
    // The sender refills the slots of the last round's last buckets now: their pages the
    // caller wrote go, while this round's first buckets arrive.
    for (std::uint32_t i = 0; i < writes_to_forget_.size(); ++i) {
      if (writes_to_forget_[i]) start_forgetting(i);
    }
  }
  if (begin.manifest != manifest_ || begin.bucket_bytes != plan_bucket_bytes_) {
    auto p = plan_buckets(begin.manifest, begin.bucket_bytes);
    if (!p.ok()) return corruption(fmt::format("round {}: {}", round, p.status().message()));
    plan_ = std::move(*p);
    manifest_ = std::move(begin.manifest);
    plan_bucket_bytes_ = begin.bucket_bytes;
    ++tensors_generation_;
  } else if (encoded_ || was_encoded) {
    ++tensors_generation_;  // the targets may differ from the last round's
  }
  begin.manifest.clear();
  fields_ = std::move(begin);
  if (plan_.bucket_count() != fields_.bucket_count) {
    return corruption(fmt::format("round {}: BEGIN says {} buckets, the plan has {}", round,
                                  fields_.bucket_count, plan_.bucket_count()));
  }
  // Encoded rounds assemble their payloads whatever the caller asked.
  const bool assembles = into == ReadInto::kViews || into == ReadInto::kWritableViews ||
                         (into == ReadInto::kDestinations && encoded_);
  if (assembles) FERRY_RETURN_IF_ERROR(check_assembly(round));
  return ok_status();
}

// Views of a tensor that spans buckets are of a copy of its size, which only the sender's
// BEGIN gives: bounded before any of it is allocated.
Status RoundReader::check_assembly(std::uint64_t round) const {
  const std::uint64_t limit = options_.max_assembled_tensor_bytes;
  for (std::size_t i = 0; i < manifest_.size(); ++i) {
    if (plan_.piece_count[i] > 1 && manifest_[i].bytes() > limit) {
      return resource_exhausted(fmt::format(
          "round {}: tensor '{}' spans buckets, so it is assembled whole in {} bytes of this "
          "receiver's memory; that passes its limit of {} bytes "
          "(SyncOptions::max_assembled_tensor_bytes): raise it, or receive into destinations",
          round, manifest_[i].name, manifest_[i].bytes(), limit));
    }
  }
  return ok_status();
}

// An encoded round needs its codec and, for a codec that decodes onto the last version
// (delta), that version held here.
Status RoundReader::check_codec(const wire::Begin& begin, std::uint64_t round) {
  codec_ = codec::receive_codec(begin.codec);
  if (codec_ == nullptr) {
    return failed_precondition(
        fmt::format("round {}: {} encodes it with codec {}, which this receiver does not know "
                    "(a newer ferry on the sender?)",
                    round, link_.peer(), begin.codec));
  }
  if (!codec_->decodes_onto_base() ||
      (begin.base_version != 0 && begin.base_version == held_version_)) {
    return ok_status();
  }
  return failed_precondition(fmt::format(
      "round {} is a {} from version {} to {}, but this receiver holds {}", round, codec_->name(),
      begin.base_version, begin.version,
      held_version_ == 0 ? std::string("no version") : fmt::format("version {}", held_version_)));
}

// Decodes a payload onto its target's bytes and checks them against the sender's hash.
Status RoundReader::decode(const wire::CodecTarget& target, std::span<const std::byte> payload,
                           std::span<std::byte> onto) const {
  const std::string what =
      fmt::format("round {} tensor '{}'", conversation_.round(), target.spec.name);
  FERRY_RETURN_IF_ERROR(codec_->decode(payload, onto, what));
  const std::uint64_t hash = XXH3_64bits(onto.data(), onto.size());
  if (hash == target.hash) return ok_status();
  const std::uint64_t base = fields_.base_version;
  return corruption(fmt::format(
      "{}: after the {} to version {} its bytes hash to {:016x}, the sender's to {:016x}{}", what,
      codec_->name(), fields_.version, hash, target.hash,
      base == 0 ? std::string()
                : fmt::format(": what this receiver held was not version {} (a destination "
                              "changed between rounds?)",
                              base)));
}

Status RoundReader::into(std::span<std::byte* const> destinations,
                         std::span<const TensorSlice* const> slices) {
  destinations_ = destinations;
  slices_ = slices;
  const bool sliced =
      std::any_of(slices.begin(), slices.end(), [](auto* s) { return s != nullptr; });
  if (encoded_ && sliced) {
    return failed_precondition(fmt::format(
        "round {} from {} is encoded ({}), which decodes whole tensors: a receiver of "
        "rank-local slices takes dense rounds only (turn delta off on the sender)",
        conversation_.round(), link_.peer(), codec_ != nullptr ? codec_->name() : "a codec"));
  }
  if (!slices.empty() && slices.size() != destinations.size()) {
    return internal_error("slices given for some of a round's destinations only");
  }
  return ok_status();
}

Result<std::optional<ReadSegment>> RoundReader::next() {
  FERRY_RETURN_IF_ERROR(check_session());
  if (!in_round_)
    return failed_precondition("no round is open: begin the round first (begin_round)");
  auto r = next_segment();
  if (!r.ok()) return abort(r.status());
  if (!*r && into_ != ReadInto::kPassThrough) in_round_ = false;  // else after acknowledge()
  return r;
}

Result<std::optional<ReadSegment>> RoundReader::next_segment() {
  if (into_ == ReadInto::kDestinations && destinations_.size() != round_tensors().size()) {
    return internal_error("a round read into destinations was given none");
  }
  const std::uint64_t round = conversation_.round();
  Result<wire::Message> m = internal_error("unset");
  {
    profiler::Span span("sync.wait_bucket", profiler::Detail::kBucket);
    m = receive_message(options_.timeout);
  }
  if (!m.ok()) return m.status();
  if (m->type() == wire::MessageType::kEnd) {
    FERRY_RETURN_IF_ERROR(end_round(std::get<wire::End>(m->body)));
    return std::optional<ReadSegment>();
  }
  const auto& f = std::get<wire::Filled>(m->body);
  const std::uint64_t planned = plan_.bucket_used[f.bucket];
  if (f.last != 0 ? f.used_bytes != planned : f.used_bytes >= planned) {
    return corruption(fmt::format("round {} bucket {}: segment ends at {}{}, the plan fills {}",
                                  round, f.bucket, f.used_bytes,
                                  f.last != 0 ? " and is the last" : "", planned));
  }
  if (!link_.shares_memory() && f.used_bytes > f.offset) {
    profiler::Span span("sync.net_receive", profiler::Detail::kBucket);
    FERRY_RETURN_IF_ERROR(receive_segment(f));
  }
  if (f.offset == 0) leases_.push_back(Lease{f.bucket, f.slot, {}});
  {
    profiler::Span span("sync.unpack", profiler::Detail::kBucket);
    FERRY_RETURN_IF_ERROR(verify_and_deliver(f, ring_->slot(f.slot)));
  }
  round_sum_->add_bucket(f.bucket, f.used_bytes, f.checksum);
  ReadSegment segment;
  segment.bucket = f.bucket;
  segment.tensors = views_;
  segment.writable = writable_views_;
  segment.bucket_ends = f.last != 0;
  segment.round_ends = segment.bucket_ends && f.bucket + 1 == plan_.bucket_count();
  segment.is_last = segment.round_ends && !more_follows_;
  return std::optional<ReadSegment>(segment);
}

Status RoundReader::end_round(const wire::End& e) {
  const std::uint64_t round = conversation_.round();
  const std::uint64_t digest = round_sum_->digest();
  if (e.round_checksum != digest) {
    return corruption(
        fmt::format("round {}: round checksum {:016x} from {}, this receiver "
                    "computed {:016x}",
                    round, e.round_checksum, link_.peer(), digest));
  }
  if (end_check_) FERRY_RETURN_IF_ERROR(end_check_(RoundEnd{round, more_follows_}));
  digest_ = digest;
  ended_ = true;
  if (into_ == ReadInto::kPassThrough) return ok_status();  // its peers acknowledge first
  // The round is over: the ACK covers every slot, so buckets still held go back now.
  while (!leases_.empty()) FERRY_RETURN_IF_ERROR(release(leases_.front().bucket));
  FERRY_RETURN_IF_ERROR(send_ack());
  if (encoded_) {
    stats_.bytes = 0;
    for (const wire::CodecTarget& t : fields_.targets) stats_.bytes += t.spec.bytes();
  }
  stats_.delivered_bytes = slices_.empty() ? stats_.bytes : delivered_bytes_;
  held_version_ = fields_.version;
  return ok_status();
}

Status RoundReader::acknowledge() {
  FERRY_RETURN_IF_ERROR(check_session());
  if (into_ != ReadInto::kPassThrough || !in_round_ || !ended_ || !leases_.empty()) {
    return abort(internal_error("acknowledge() before a pass-through round's END and releases"));
  }
  Status s = send_ack();
  if (!s.ok()) return abort(s);
  in_round_ = false;
  return ok_status();
}

Status RoundReader::send_ack() {
  const std::uint64_t round = conversation_.round();
  FERRY_RETURN_IF_ERROR(
      link_.send(wire::encode(session_message(conversation_.session(), round,
                                              wire::Ack{fields_.bucket_count, digest_})),
                 options_.timeout));
  stats_ = finished_round(round, manifest_.size(), plan_, start_, digest_);
  stats_.more_follows = more_follows_;
  stats_.step = fields_.step;
  if (fields_.step) set_min_step(*fields_.step);
  stats_.delta = encoded_;
  stats_.base_version = fields_.base_version;
  stats_.version = fields_.version;
  return ok_status();
}

Status RoundReader::release(std::uint32_t bucket) {
  FERRY_RETURN_IF_ERROR(check_session());
  if (leases_.empty() || leases_.front().bucket != bucket) {
    return failed_precondition(
        fmt::format("release of bucket {}: buckets are released in order, and {}", bucket,
                    leases_.empty() ? std::string("none is held")
                                    : fmt::format("bucket {} is next", leases_.front().bucket)));
  }
  Lease lease = std::move(leases_.front());
  leases_.pop_front();
  if (!lease.assembled.empty()) spare_.push_back(std::move(lease.assembled));
  Status s = send_release(lease);
  if (!s.ok()) return abort(s);
  return ok_status();
}

Status RoundReader::send_release(const Lease& lease) {
  profiler::Span span("sync.release", profiler::Detail::kBucket);
  if (into_ == ReadInto::kWritableViews) {
    if (lease.bucket + 1 < plan_.bucket_count()) {
      start_forgetting(lease.slot);
    } else {
      writes_to_forget_[lease.slot] = true;  // its views stay readable until the next round
    }
  }
  const wire::Message release = session_message(conversation_.session(), conversation_.round(),
                                                wire::Release{lease.slot, lease.bucket});
  conversation_.sent(release);  // the slot may be filled again
  return link_.send(wire::encode(release), options_.timeout);
}

// Not sharing memory: the segment's bytes follow its FILLED, straight into this ring.
Status RoundReader::receive_segment(const wire::Filled& f) {
  std::span<std::byte> into(ring_->slot(f.slot) + f.offset, f.used_bytes - f.offset);
  Status s = link_.channel().receive_segment(into, ring_region_.get(), options_.timeout);
  if (s.ok()) return s;
  return Status(s.code(), fmt::format("round {} bucket {}: {}", conversation_.round(), f.bucket,
                                      s.message()));
}

// Checks segment f's checksum and delivers it. Destinations are hashed as they are copied
// (one read of the slot) and so checked after writing: a corrupt bucket then aborts the round
// with destinations partly written, which is what any failure in that mode leaves. Views are
// handed out only after the check.
Status RoundReader::verify_and_deliver(const wire::Filled& f, const std::byte* slot) {
  std::uint64_t sum = f.checksum;
  Status delivered;
  const bool copy_out = into_ == ReadInto::kDestinations && !encoded_;
  if (!checksums_) {
    delivered = deliver(f, slot, nullptr);
  } else if (copy_out) {
    BucketHash hash(slot, f.offset);
    delivered = deliver(f, slot, &hash);
    sum = hash.finish(f.used_bytes);
  } else {
    sum = XXH3_64bits(slot + f.offset, f.used_bytes - f.offset);
    if (sum == f.checksum) delivered = deliver(f, slot, nullptr);
  }
  if (sum != f.checksum) {
    return corruption(
        fmt::format("round {} bucket {} (slot {}, bytes {}-{}): checksum {:016x}, {} "
                    "announced {:016x}: {}",
                    conversation_.round(), f.bucket, f.slot, f.offset, f.used_bytes, sum,
                    link_.peer(), f.checksum,
                    link_.shares_memory() ? "the shared memory was corrupted"
                                          : "the bytes changed on the way"));
  }
  return delivered;
}

// Delivers segment f (slot bytes [f.offset, f.used_bytes) of bucket f.bucket); `hash` (may be
// null) takes the bytes copied into destinations.
Status RoundReader::deliver(const wire::Filled& f, const std::byte* slot, BucketHash* hash) {
  if (into_ == ReadInto::kPassThrough) return ok_status();
  views_.clear();
  writable_views_.clear();
  std::byte* writable_slot = nullptr;
  if (into_ == ReadInto::kWritableViews) {
    writable_slot = cow_->slot(f.slot);
    // The slot's last bucket was released, so its views are done with: pages the caller
    // wrote then read the ring again.
    if (f.offset == 0) {
      FERRY_RETURN_IF_ERROR(forgotten(f.slot));
      FERRY_RETURN_IF_ERROR(cow_->unseal(f.slot));
    }
  }
  if (f.offset == 0) walker_ = SegmentWalker(plan_.bucket(f.bucket));
  const bool last = f.last != 0;
  if (into_ == ReadInto::kDestinations && !encoded_) {
    walker_.walk(
        f.offset, f.used_bytes, last,
        [&](const Piece& p, std::uint64_t at, std::uint64_t n) {
          const std::byte* src = slot + p.bucket_offset + at;
          if (!slices_.empty() && slices_[p.tensor] != nullptr) {
            delivered_bytes_ += copy_selected(slices_[p.tensor]->runs, destinations_[p.tensor], src,
                                              p.tensor_offset + at, n, p.bucket_offset + at, hash);
            return;
          }
          std::byte* dst = destinations_[p.tensor] + p.tensor_offset + at;
          delivered_bytes_ += n;
          if (hash != nullptr) {
            hash->copy_piece(dst, src, n, p.bucket_offset + at);
          } else {
            copy_bytes(dst, src, n);
          }
        },
        [](const Piece&) {});
    return ok_status();
  }
  Status status;
  walker_.walk(
      f.offset, f.used_bytes, last,
      [&](const Piece& p, std::uint64_t at, std::uint64_t n) {
        if (plan_.piece_count[p.tensor] == 1) return;  // handed out as a view when it ends
        if (p.tensor_offset + at == 0) {
          if (staging_.capacity() == 0 && !spare_.empty()) {
            staging_ = std::move(spare_.back());
            spare_.pop_back();
          }
          staging_.resize(manifest_[p.tensor].bytes());
        }
        copy_bytes(staging_.data() + p.tensor_offset + at, slot + p.bucket_offset + at, n);
      },
      [&](const Piece& p) {
        if (!status.ok()) return;
        const TensorSpec& spec = manifest_[p.tensor];
        if (plan_.piece_count[p.tensor] == 1) {
          // Zero-copy: a view into the ring, whose earlier segments stay until RELEASE.
          std::byte* writable =
              writable_slot != nullptr ? writable_slot + p.bucket_offset : nullptr;
          status = finish_tensor(p.tensor, TensorView{spec, {slot + p.bucket_offset, p.length}},
                                 writable);
        } else if (p.tensor_offset + p.length == spec.bytes()) {
          // Kept with the bucket's lease, as the ring's views are.
          UninitBuffer& whole = leases_.back().assembled;
          whole.swap(staging_);
          status =
              finish_tensor(p.tensor, TensorView{spec, {whole.data(), whole.size()}}, whole.data());
        }
      });
  return status;
}

// Hands finished tensor i out as a view. In an encoded round `tensor` is its payload,
// decoded first onto the destination or this receiver's copy.
Status RoundReader::finish_tensor(std::size_t i, TensorView tensor, std::byte* writable) {
  if (encoded_) {
    const wire::CodecTarget& target = fields_.targets[i];
    const bool onto_destination = into_ == ReadInto::kDestinations;
    const std::span<std::byte> onto =
        onto_destination ? std::span<std::byte>(destinations_[i], target.spec.bytes())
                         : copies_.copy_of(target.spec);
    FERRY_RETURN_IF_ERROR(decode(target, tensor.data, onto));
    if (onto_destination) return ok_status();
    tensor = TensorView{target.spec, onto};
  } else if (fields_.keep_copies != 0) {
    copies_.keep(tensor);
  }
  if (into_ == ReadInto::kWritableViews) {
    writable_views_.push_back({tensor.spec, {writable, tensor.data.size()}});
  } else {
    views_.push_back(tensor);
  }
  return ok_status();
}

Status RoundReader::writable_views_error() {
  if (!cow_error_) {
    if (ring_->slots() < 2) {
      cow_error_ = failed_precondition(
          fmt::format("writable views hold a ring slot until the next bucket, so they need a "
                      "ring of 2 slots or more; {}'s has {}",
                      link_.peer(), ring_->slots()));
    } else {
      auto view = ring_->writable_view();
      cow_error_ = view.status();
      if (view.ok()) {
        cow_ = std::move(*view);
        writes_to_forget_.assign(ring_->slots(), false);
        forgetting_.resize(ring_->slots());
      }
    }
  }
  return *cow_error_;
}

// Starts dropping the pages written into slot i's views, in the background.
void RoundReader::start_forgetting(std::uint32_t i) {
  writes_to_forget_[i] = false;
  // Sealed first: a write before the seal is dropped by the scan, one after it faults, so no
  // view written after its lease changes what this slot shows later.
  forgetting_[i] = std::async(std::launch::async, [this, i] {
    FERRY_RETURN_IF_ERROR(cow_->seal(i));
    return cow_->forget_writes(i);
  });
}

// Waits until slot i shows the ring's bytes again in the copy-on-write view.
Status RoundReader::forgotten(std::uint32_t i) {
  if (writes_to_forget_[i]) start_forgetting(i);
  if (!forgetting_[i].valid()) return ok_status();
  return forgetting_[i].get();
}

std::span<const std::byte> RoundReader::ring_memory() const { return ring_->memory(); }

}  // namespace ferry::sync
