#include <fmt/format.h>
#include <unistd.h>
#include <xxhash.h>

#include <chrono>
#include <future>
#include <optional>
#include <unordered_map>

#include "base/clock.h"
#include "base/status_macros.h"
#include "ferry/sync.h"
#include "profiler/span.h"
#include "sync/bucket_planner.h"
#include "sync/copy.h"
#include "sync/delta_receiver.h"
#include "sync/fanout.h"
#include "sync/link.h"
#include "sync/round_checksum.h"
#include "sync/round_stats.h"
#include "sync/segment.h"
#include "sync/sync_options.h"
#include "transport/shm/cow_view.h"
#include "transport/shm/memfd_ring.h"
#include "transport/transport.h"
#include "wire/conversation.h"
#include "wire/message.h"

namespace ferry::sync {
namespace {

// What one round does with each verified bucket.
struct Delivery {
  const TensorCallback* on_tensor = nullptr;
  const BucketCallback* on_bucket = nullptr;
  const WritableBucketCallback* on_writable = nullptr;
  const WritableSegmentCallback* on_writable_segment = nullptr;
  bool into_destinations = false;
  // A delta round: finished blobs are applied (onto destinations, or onto the copies
  // whose views the callbacks get).
  bool delta = false;
  bool delta_into_destinations = false;

  bool writable() const { return on_writable != nullptr || on_writable_segment != nullptr; }
};

}  // namespace

struct Receiver::Impl {
  SyncOptions options;
  InterruptCheck interrupted;  // set with options in connect()
  std::uint32_t id = 0;
  Link channel;
  wire::Conversation conversation{wire::Conversation::Role::kReceiver, "", 0};
  // A sender that shares memory passes its ring to map; for the others the ring is this
  // process's own memory, registered for the segments sent into it.
  shm::MemfdRing ring;
  std::unique_ptr<transport::Region> ring_region;  // after ring: deregistered before unmapping
  bool checksums = true;
  Status broken;
  std::unordered_map<std::string, MutableTensorView> destinations;
  // Where manifest tensor i goes, valid while destinations_resolved.
  std::vector<std::byte*> destination_data;
  bool destinations_resolved = false;
  std::vector<TensorSpec> manifest;
  std::uint64_t plan_bucket_bytes = 0;
  bool more_follows = false;  // the current round's BEGIN: another round of the update follows
  BucketPlan plan;
  std::vector<std::byte> staging;  // a tensor split across buckets, being assembled
  // Bucket mode delivers after the whole bucket; the next split tensor may start in the
  // same bucket, so the finished one moves here before staging is reused.
  std::vector<std::byte> completed;
  std::vector<TensorView> bucket_views;
  SegmentWalker walker{{}};  // the bucket being received
  DeltaReceiver delta_rx;
  wire::Begin delta_fields;  // the current round's BEGIN delta fields (its manifest moved out)
  // Writable bucket mode: the ring's copy-on-write view (mapped on first use, or why not),
  // the views of the bucket being delivered, the bucket whose views the caller still holds
  // (released after the next bucket's callback) and the split tensors assembled for the
  // current and the held bucket.
  shm::CowView cow;
  std::optional<Status> cow_error;
  std::vector<MutableTensorView> writable_views;
  std::optional<wire::Release> held;
  std::vector<std::vector<std::byte>> assembled_now;
  std::vector<std::vector<std::byte>> assembled_held;
  // Their memory once the caller is done with it, reused for the next split tensors: fresh
  // memory for each would fault its pages in again every round.
  std::vector<std::vector<std::byte>> assembled_spare;
  // The pages the caller wrote into a released slot's views are dropped before the slot's
  // views are handed out again. The scan (pagemap) takes ~15 ms per 512 MiB, so it runs in
  // the background: a slot held for the next bucket is scanned as soon as it is released; the
  // round's last bucket, whose views stay readable and keep their writes until the sender
  // refills the slot, when the next writable round begins. After cow: joined before it unmaps.
  std::vector<bool> writes_to_forget;           // per slot: released, not yet scanned
  std::vector<std::future<Status>> forgetting;  // per slot: the scan running, if any

  BeginCheck begin_check;

  Status check_begin(std::uint64_t round, const wire::Begin& begin) const {
    if (!begin_check) return ok_status();
    std::vector<TensorSpec> targets;
    for (const wire::DeltaTarget& t : begin.targets) targets.push_back(t.spec);
    return begin_check(
        RoundBegin{round, begin.more_follows != 0, begin.delta != 0 ? targets : begin.manifest});
  }

  wire::Message message(std::uint64_t round, wire::Body body) const {
    return session_message(conversation.session(), round, std::move(body));
  }

  // Tells the sender why this receiver gives up (best effort) and breaks the session.
  Status fail(Status why, std::uint64_t round) {
    if (broken.ok()) broken = why;
    if (channel.valid()) {
      (void)channel.send(wire::encode(message(round, wire::Error{why.code(), why.message()})),
                         std::chrono::milliseconds(100));
      channel.abort();
    }
    return why;
  }

  Result<wire::Message> next(std::chrono::milliseconds timeout) {
    FERRY_ASSIGN_OR_RETURN(auto got,
                           receive_heeding_interrupt(channel, timeout, options, interrupted));
    return decode_from_sender(got, channel, conversation);
  }

  // Finds each manifest tensor's destination, once per manifest and registration change:
  // a round of 20,000 small tensors must not look up 20,000 names.
  Status resolve_destinations() {
    if (destinations_resolved) return ok_status();
    std::vector<std::string> problems;
    destination_data.assign(manifest.size(), nullptr);
    for (std::size_t i = 0; i < manifest.size(); ++i) {
      const TensorSpec& spec = delta_fields.delta != 0 ? delta_fields.targets[i].spec : manifest[i];
      auto it = destinations.find(spec.name);
      if (it == destinations.end()) {
        problems.push_back(
            fmt::format("missing destination for '{}' ({})", spec.name, spec.to_string()));
        continue;
      }
      destination_data[i] = it->second.data.data();
      const TensorSpec& d = it->second.spec;
      if (d.dtype != spec.dtype || d.shape != spec.shape) {
        problems.push_back(fmt::format("'{}': sender sends {} {}, destination is {} {}", spec.name,
                                       spec.shape_string(), dtype_name(spec.dtype),
                                       d.shape_string(), dtype_name(d.dtype)));
      }
    }
    if (problems.empty()) {
      destinations_resolved = true;
      return ok_status();
    }
    std::string text =
        fmt::format("round {}: {} manifest mismatch(es) in destination mode:", conversation.round(),
                    problems.size());
    for (const std::string& p : problems) text += "\n  " + p;
    return invalid_argument(text);
  }

  // Callback modes assemble a tensor that spans buckets in memory of its size, which only the
  // sender's BEGIN gives: bounded before any of it is allocated.
  Status check_assembly(std::uint64_t round) const {
    const std::uint64_t limit = options.max_assembled_tensor_bytes;
    for (std::size_t i = 0; i < manifest.size(); ++i) {
      if (plan.piece_count[i] > 1 && manifest[i].bytes() > limit) {
        return resource_exhausted(fmt::format(
            "round {}: tensor '{}' spans buckets, so it is assembled whole in {} bytes of this "
            "receiver's memory; that passes its limit of {} bytes "
            "(SyncOptions::max_assembled_tensor_bytes): raise it, or receive into destinations",
            round, manifest[i].name, manifest[i].bytes(), limit));
      }
    }
    return ok_status();
  }

  // Maps the copy-on-write view once; OK when writable bucket mode can run.
  Status map_writable_views() {
    if (!cow_error) {
      if (ring.slots() < 2) {
        cow_error = failed_precondition(
            fmt::format("writable views hold a ring slot until the next bucket, so they need a "
                        "ring of 2 slots or more; {}'s has {}",
                        channel.peer(), ring.slots()));
      } else {
        auto view = shm::CowView::map(ring.fd(), ring.slots(), ring.slot_bytes());
        cow_error = view.status();
        if (view.ok()) {
          cow = std::move(*view);
          writes_to_forget.assign(ring.slots(), false);
          forgetting.resize(ring.slots());
        }
      }
    }
    return *cow_error;
  }

  // Starts dropping the pages written into slot i's views, in the background.
  void start_forgetting(std::uint32_t i) {
    writes_to_forget[i] = false;
    forgetting[i] = std::async(std::launch::async, [this, i] { return cow.forget_writes(i); });
  }

  // Waits until slot i shows the ring's bytes again in the copy-on-write view.
  Status forgotten(std::uint32_t i) {
    if (writes_to_forget[i]) start_forgetting(i);
    if (!forgetting[i].valid()) return ok_status();
    return forgetting[i].get();
  }

  // Hands finished tensor i to the tensor callback, or keeps it for the bucket callback.
  // In a delta round `tensor` is its blob, applied first. `writable`: the same bytes where
  // the writable bucket callback may write them.
  Status finish_tensor(std::size_t i, TensorView tensor, const Delivery& how,
                       std::byte* writable = nullptr) {
    if (how.delta) {
      const wire::DeltaTarget& target = delta_fields.targets[i];
      const std::span<std::byte> onto =
          how.delta_into_destinations
              ? std::span<std::byte>(destination_data[i], target.spec.bytes())
              : delta_rx.copy_of(target.spec);
      FERRY_RETURN_IF_ERROR(
          delta_rx.apply(tensor.data, onto, target, delta_fields, conversation.round()));
      if (how.delta_into_destinations) return ok_status();
      tensor = TensorView{target.spec, onto};
    } else if (delta_fields.keep_for_delta != 0) {
      delta_rx.keep(tensor);
    }
    if (how.writable()) {
      writable_views.push_back({tensor.spec, {writable, tensor.data.size()}});
      return ok_status();
    }
    if (how.on_tensor == nullptr) {
      bucket_views.push_back(tensor);
      return ok_status();
    }
    Status s = (*how.on_tensor)(tensor);
    if (!s.ok()) return s.with_context(fmt::format("tensor callback for '{}'", tensor.spec.name));
    return ok_status();
  }

  // Delivers segment f (slot bytes [f.offset, f.used_bytes) of bucket f.bucket) as the
  // round asks; `hash` (may be null) takes the bytes destination mode copies.
  Status deliver(const wire::Filled& f, const std::byte* slot, const Delivery& how,
                 BucketHash* hash) {
    std::byte* writable_slot = nullptr;
    if (how.writable()) {
      writable_slot = cow.slot(f.slot);
      if (f.offset == 0) {
        // The slot's last bucket was released, so its views are done with: pages the caller
        // wrote then read the ring again. The held bucket's views stay valid.
        FERRY_RETURN_IF_ERROR(forgotten(f.slot));
        for (auto& done : assembled_held) assembled_spare.push_back(std::move(done));
        assembled_held = std::move(assembled_now);
        assembled_now.clear();
      }
      if (f.offset == 0 || how.on_writable_segment != nullptr) writable_views.clear();
    }
    if (f.offset == 0) {
      walker = SegmentWalker(plan.bucket(f.bucket));
      bucket_views.clear();
    }
    const bool last = f.last != 0;
    if (how.into_destinations) {
      walker.walk(
          f.offset, f.used_bytes, last,
          [&](const Piece& p, std::uint64_t at, std::uint64_t n) {
            std::byte* dst = destination_data[p.tensor] + p.tensor_offset + at;
            const std::byte* src = slot + p.bucket_offset + at;
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
    walker.walk(
        f.offset, f.used_bytes, last,
        [&](const Piece& p, std::uint64_t at, std::uint64_t n) {
          if (plan.piece_count[p.tensor] == 1) return;  // handed out as a view when it ends
          if (p.tensor_offset + at == 0) {
            if (staging.capacity() == 0 && !assembled_spare.empty()) {
              staging = std::move(assembled_spare.back());
              assembled_spare.pop_back();
            }
            staging.resize(manifest[p.tensor].bytes());
          }
          copy_bytes(staging.data() + p.tensor_offset + at, slot + p.bucket_offset + at, n);
        },
        [&](const Piece& p) {
          if (!status.ok()) return;
          const TensorSpec& spec = manifest[p.tensor];
          if (plan.piece_count[p.tensor] == 1) {
            // Zero-copy: a view into the ring, whose earlier segments stay until RELEASE.
            std::byte* writable =
                writable_slot != nullptr ? writable_slot + p.bucket_offset : nullptr;
            status = finish_tensor(p.tensor, TensorView{spec, {slot + p.bucket_offset, p.length}},
                                   how, writable);
          } else if (p.tensor_offset + p.length == spec.bytes() && how.writable()) {
            // Kept until the caller is done with this bucket, as the ring's views are.
            std::vector<std::byte>& whole = assembled_now.emplace_back();
            whole.swap(staging);
            status = finish_tensor(p.tensor, TensorView{spec, {whole.data(), whole.size()}}, how,
                                   whole.data());
          } else if (p.tensor_offset + p.length == spec.bytes()) {
            completed.swap(staging);
            status = finish_tensor(p.tensor, TensorView{spec, {completed.data(), completed.size()}},
                                   how);
          }
        });
    if (!status.ok()) return status;
    if (how.on_writable_segment != nullptr && (last || !writable_views.empty())) {
      const bool round_ends = last && f.bucket + 1 == plan.bucket_count();
      const WritableSegment segment{writable_views, last, round_ends && !more_follows, round_ends};
      Status s = (*how.on_writable_segment)(segment);
      if (!s.ok()) {
        return s.with_context(fmt::format("segment callback for bucket {} bytes {}-{}", f.bucket,
                                          f.offset, f.used_bytes));
      }
    }
    if ((how.on_bucket != nullptr || how.on_writable != nullptr) && last) {
      const bool round_ends = f.bucket + 1 == plan.bucket_count();
      const bool update_ends = round_ends && !more_follows;
      Status s = how.on_bucket != nullptr
                     ? (*how.on_bucket)(bucket_views, update_ends)
                     : (*how.on_writable)(writable_views, update_ends, round_ends);
      if (!s.ok()) return s.with_context(fmt::format("bucket callback for bucket {}", f.bucket));
    }
    return ok_status();
  }

  // Checks segment f's checksum and delivers it. Destination mode hashes each piece as it
  // copies it (one read of the slot) and so checks after writing: a corrupt bucket then
  // aborts the round with destinations partly written, which is what any failure in
  // destination mode leaves. Views are handed out only after the check.
  Status verify_and_deliver(const wire::Filled& f, const std::byte* slot, const Delivery& how) {
    std::uint64_t sum = f.checksum;
    Status delivered;
    if (!checksums) {
      delivered = deliver(f, slot, how, nullptr);
    } else if (how.into_destinations) {
      BucketHash hash(slot, f.offset);
      delivered = deliver(f, slot, how, &hash);
      sum = hash.finish(f.used_bytes);
    } else {
      sum = XXH3_64bits(slot + f.offset, f.used_bytes - f.offset);
      if (sum == f.checksum) delivered = deliver(f, slot, how, nullptr);
    }
    if (sum != f.checksum) {
      return corruption(
          fmt::format("round {} bucket {} (slot {}, bytes {}-{}): checksum {:016x}, {} "
                      "announced {:016x}: the shared memory was corrupted",
                      conversation.round(), f.bucket, f.slot, f.offset, f.used_bytes, sum,
                      channel.peer(), f.checksum));
    }
    return delivered;
  }

  Result<RoundStats> receive(const Delivery& how) {
    auto first = next(options.idle_timeout);
    if (!first.ok()) return first.status();
    const std::uint64_t round = first->round;
    auto r = receive_rest(how, std::move(*first));
    if (r.ok()) return r;
    delta_rx.forget();
    // A send that failed because the sender died or gave up: its ERROR may be waiting.
    Status why = r.status();
    if (why.code() == Code::kAborted && channel.valid()) {
      auto pending = next(std::chrono::milliseconds(0));
      if (!pending.ok() &&
          pending.status().message().find("aborted the session") != std::string::npos) {
        why = pending.status();
      }
    }
    return Status(why.code(), fmt::format("round {} aborted: {}", round, why.message()));
  }

  Result<RoundStats> receive_rest(const Delivery& asked, wire::Message first_message) {
    const auto start = Clock::now();
    wire::Message* first = &first_message;
    const std::uint64_t round = first->round;
    if (first->type() != wire::MessageType::kBegin) {
      return internal_error("conversation let a non-BEGIN message start a round");
    }
    const std::vector<std::byte> begin_bytes = wire::encode(*first);
    auto& begin = std::get<wire::Begin>(first->body);
    more_follows = begin.more_follows != 0;
    FERRY_RETURN_IF_ERROR(check_begin(round, begin));
    FERRY_RETURN_IF_ERROR(delta_rx.check_begin(begin, round));
    // Callback modes keep copies sized by BEGIN: bounded before any is made.
    if (!asked.into_destinations) FERRY_RETURN_IF_ERROR(delta_rx.check_keep(begin, round));
    // A delta round is received as blobs, as the callback modes receive tensors.
    Delivery how = asked;
    how.delta = begin.delta != 0;
    if (how.delta && asked.writable()) {
      return failed_precondition(
          fmt::format("round {} is a delta round: writable views cannot be given for it (the "
                      "views would be the copies deltas apply onto); receive it with "
                      "receive_round_buckets",
                      round));
    }
    held.reset();
    if (how.writable()) {
      // The sender refills the slots of the last round's last buckets now: their pages the
      // caller wrote go, while this round's first buckets arrive.
      for (std::uint32_t i = 0; i < writes_to_forget.size(); ++i) {
        if (writes_to_forget[i]) start_forgetting(i);
      }
    }
    how.delta_into_destinations = how.delta && asked.into_destinations;
    if (how.delta) {
      how.into_destinations = false;
      destinations_resolved = false;  // resolved against the targets, not the blobs
    } else if (delta_fields.delta != 0) {
      destinations_resolved = false;
    }
    if (begin.manifest != manifest || begin.bucket_bytes != plan_bucket_bytes) {
      auto p = plan_buckets(begin.manifest, begin.bucket_bytes);
      if (!p.ok()) return corruption(fmt::format("round {}: {}", round, p.status().message()));
      plan = std::move(*p);
      manifest = std::move(begin.manifest);
      plan_bucket_bytes = begin.bucket_bytes;
      destinations_resolved = false;
    }
    begin.manifest.clear();
    delta_fields = std::move(begin);
    if (plan.bucket_count() != delta_fields.bucket_count) {
      return corruption(fmt::format("round {}: BEGIN says {} buckets, the plan has {}", round,
                                    delta_fields.bucket_count, plan.bucket_count()));
    }
    if (!how.into_destinations) FERRY_RETURN_IF_ERROR(check_assembly(round));
    if (asked.into_destinations) {
      Status s = resolve_destinations();
      if (!s.ok()) return s;
    }
    RoundChecksum round_sum(begin_bytes);
    while (true) {
      Result<wire::Message> m = internal_error("unset");
      {
        profiler::Span span("sync.wait_bucket", profiler::Detail::kBucket);
        m = next(options.timeout);
      }
      if (!m.ok()) return m.status();
      if (m->type() == wire::MessageType::kEnd) {
        const auto& e = std::get<wire::End>(m->body);
        const std::uint64_t digest = round_sum.digest();
        if (e.round_checksum != digest) {
          return corruption(
              fmt::format("round {}: round checksum {:016x} from {}, this "
                          "receiver computed {:016x}",
                          round, e.round_checksum, channel.peer(), digest));
        }
        Status s = channel.send(wire::encode(message(round, wire::Ack{e.bucket_count, digest})),
                                options.timeout);
        if (!s.ok()) return s;
        RoundStats stats = finished_round(round, manifest.size(), plan, start, digest);
        stats.more_follows = more_follows;
        stats.delta = how.delta;
        stats.base_version = delta_fields.base_version;
        stats.version = delta_fields.version;
        if (how.delta) {
          stats.bytes = 0;
          for (const wire::DeltaTarget& t : delta_fields.targets) stats.bytes += t.spec.bytes();
        }
        delta_rx.completed(delta_fields);
        if (plan.bucket_count() == 0 && !more_follows) {
          Status cb = ok_status();
          if (how.on_bucket != nullptr) cb = (*how.on_bucket)({}, true);
          if (how.on_writable != nullptr) cb = (*how.on_writable)({}, true, true);
          if (how.on_writable_segment != nullptr) {
            cb = (*how.on_writable_segment)(WritableSegment{{}, true, true, true});
          }
          if (!cb.ok()) return cb;
        }
        return stats;
      }
      const auto& f = std::get<wire::Filled>(m->body);
      const std::uint64_t planned = plan.bucket_used[f.bucket];
      if (f.last != 0 ? f.used_bytes != planned : f.used_bytes >= planned) {
        return corruption(fmt::format("round {} bucket {}: segment ends at {}{}, the plan fills {}",
                                      round, f.bucket, f.used_bytes,
                                      f.last != 0 ? " and is the last" : "", planned));
      }
      const std::byte* slot = ring.slot(f.slot);
      Status s;
      if (!channel.shares_memory() && f.used_bytes > f.offset) {
        profiler::Span span("sync.net_receive", profiler::Detail::kBucket);
        s = receive_segment(f);
        if (!s.ok()) return s;
      }
      {
        profiler::Span span("sync.unpack", profiler::Detail::kBucket);
        s = verify_and_deliver(f, slot, how);
      }
      if (!s.ok()) return s;
      round_sum.add_bucket(f.bucket, f.used_bytes, f.checksum);
      if (f.last == 0) continue;  // the slot is released with the bucket's last segment
      profiler::Span span("sync.release", profiler::Detail::kBucket);
      if (how.writable()) {
        // The caller held the bucket before until this one's callback returned.
        if (held) {
          start_forgetting(held->slot);
          s = channel.send(wire::encode(message(round, *held)), options.timeout);
          held.reset();
          if (!s.ok()) return s;
        }
        if (f.bucket + 1 < plan.bucket_count()) {
          held = wire::Release{f.slot, f.bucket};
          continue;
        }
        writes_to_forget[f.slot] = true;
      }
      s = channel.send(wire::encode(message(round, wire::Release{f.slot, f.bucket})),
                       options.timeout);
      if (!s.ok()) return s;
    }
  }

  // Not sharing memory: the segment's bytes follow its FILLED, straight into this ring.
  Status receive_segment(const wire::Filled& f) {
    std::span<std::byte> into(ring.slot(f.slot) + f.offset, f.used_bytes - f.offset);
    Status s = channel.channel().receive_segment(into, ring_region.get(), options.timeout);
    if (s.ok()) return s;
    return Status(s.code(), fmt::format("round {} bucket {}: {}", conversation.round(), f.bucket,
                                        s.message()));
  }

  Result<RoundStats> run(const Delivery& how) {
    if (!broken.ok()) {
      return failed_precondition("the session failed earlier: " + broken.to_string());
    }
    auto r = receive(how);
    if (!r.ok()) return fail(r.status(), conversation.round());
    return r;
  }
};

Receiver::Receiver(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Receiver::~Receiver() = default;

Result<std::unique_ptr<Receiver>> Receiver::connect(const std::string& address,
                                                    std::uint32_t receiver_id,
                                                    const SyncOptions& options,
                                                    std::uint64_t session) {
  if (options.timeout.count() <= 0) return invalid_argument("timeout must be positive");
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  impl->interrupted = InterruptCheck(options);
  impl->delta_rx = DeltaReceiver(options.delta_keep_limit);
  impl->id = receiver_id;
  ScopedFd ring_fd;
  auto link = connect_upstream(address, options);
  if (!link.ok()) return link.status();
  impl->channel = std::move(*link);
  impl->conversation =
      wire::Conversation(wire::Conversation::Role::kReceiver, impl->channel.peer(), session);
  wire::Message hello;
  hello.session = session;
  hello.body = wire::Hello{receiver_id, static_cast<std::uint32_t>(::getpid())};
  Status s = impl->channel.send(wire::encode(hello), options.timeout);
  if (!s.ok()) return s;
  // A sender that is up but not yet in accept() answers later: wait in slices (Ctrl-C).
  auto got = retry_in_slices(options, options.timeout, "no answer from " + impl->channel.peer(),
                             [&](std::chrono::milliseconds slice) {
                               return impl->channel.receive_with_fd(slice, &ring_fd);
                             });
  if (!got.ok()) return got.status().with_context("waiting for WELCOME");
  auto m = wire::decode(*got, impl->channel.peer());
  if (!m.ok()) return m.status();
  s = impl->conversation.received(*m);
  if (!s.ok()) return s;
  if (m->type() == wire::MessageType::kError) {
    const auto& e = std::get<wire::Error>(m->body);
    return Status(e.code, fmt::format("{} turned receiver {} away: {}", impl->channel.peer(),
                                      receiver_id, e.message));
  }
  const auto& w = std::get<wire::Welcome>(m->body);
  impl->checksums = w.checksums != 0;
  if (!impl->channel.shares_memory()) {
    // This node's copy of the ring; the sender sends each segment into it. Its size is the
    // sender's to choose, so it is bounded here before any of it is allocated.
    Status sized = check_ring_size(options, impl->channel.peer(),
                                   fmt::format("receiver {}", receiver_id), w.slots, w.slot_bytes);
    if (!sized.ok()) return sized;
    auto ring = shm::MemfdRing::create(w.slots, w.slot_bytes);
    if (!ring.ok()) return ring.status();
    impl->ring = std::move(*ring);
    FERRY_ASSIGN_OR_RETURN(impl->ring_region,
                           impl->channel.channel().register_memory(
                               std::span(impl->ring.slot(0), std::size_t{w.slots} * w.slot_bytes)));
  } else {
    if (!ring_fd.valid()) {
      return corruption(
          fmt::format("WELCOME from {} carried no ring descriptor", impl->channel.peer()));
    }
    auto ring = shm::MemfdRing::map_readonly(std::move(ring_fd), w.slots, w.slot_bytes,
                                             impl->channel.peer());
    if (!ring.ok()) return ring.status();
    impl->ring = std::move(*ring);
  }
  return std::unique_ptr<Receiver>(new Receiver(std::move(impl)));
}

Status Receiver::set_destination(MutableTensorView destination) {
  if (destination.data.size() != destination.spec.bytes()) {
    return invalid_argument(fmt::format("destination '{}': {} bytes given, {} needs {}",
                                        destination.spec.name, destination.data.size(),
                                        destination.spec.to_string(), destination.spec.bytes()));
  }
  std::string name = destination.spec.name;
  impl_->destinations.insert_or_assign(std::move(name), std::move(destination));
  impl_->destinations_resolved = false;
  return ok_status();
}

void Receiver::clear_destinations() {
  impl_->destinations.clear();
  impl_->destinations_resolved = false;
}

void Receiver::set_begin_check(BeginCheck check) { impl_->begin_check = std::move(check); }

Result<RoundStats> Receiver::receive_round_into() {
  Delivery how;
  how.into_destinations = true;
  return impl_->run(how);
}

Result<RoundStats> Receiver::receive_round(const TensorCallback& on_tensor) {
  Delivery how;
  how.on_tensor = &on_tensor;
  return impl_->run(how);
}

Result<RoundStats> Receiver::receive_round_buckets(const BucketCallback& on_bucket) {
  Delivery how;
  how.on_bucket = &on_bucket;
  return impl_->run(how);
}

Result<RoundStats> Receiver::receive_round_buckets_writable(
    const WritableBucketCallback& on_bucket) {
  if (impl_->broken.ok()) FERRY_RETURN_IF_ERROR(impl_->map_writable_views());
  Delivery how;
  how.on_writable = &on_bucket;
  return impl_->run(how);
}

Result<RoundStats> Receiver::receive_round_segments_writable(
    const WritableSegmentCallback& on_segment) {
  if (impl_->broken.ok()) FERRY_RETURN_IF_ERROR(impl_->map_writable_views());
  Delivery how;
  how.on_writable_segment = &on_segment;
  return impl_->run(how);
}

Status Receiver::writable_views_error() { return impl_->map_writable_views(); }

std::span<const std::byte> Receiver::ring_memory() const {
  const shm::MemfdRing& ring = impl_->ring;
  if (ring.slots() == 0) return {};
  return {ring.slot(0), static_cast<std::size_t>(ring.slots()) * ring.slot_bytes()};
}
std::uint64_t Receiver::session_id() const { return impl_->conversation.session(); }
std::uint64_t Receiver::last_round() const { return impl_->conversation.round(); }

}  // namespace ferry::sync
