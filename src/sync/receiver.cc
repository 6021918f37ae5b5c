#include <fmt/format.h>

#include "base/status_macros.h"
#include "ferry/sync.h"
#include "sync/destinations.h"
#include "sync/join.h"
#include "sync/round_reader.h"

// Each delivery mode is a loop over the session's RoundReader (sync/round_reader.h).
namespace ferry::sync {

struct Receiver::Impl {
  std::unique_ptr<RoundReader> reader;
  Destinations destinations;  // receive_round_into's

  // Runs one round read `into` (Receiver's pull calls), handing each segment to `use`; the
  // caller's errors abort the round as the reader's do.
  template <class Use>
  Result<RoundStats> read(Receiver& rx, ReadInto into, Use&& use) {
    FERRY_RETURN_IF_ERROR(rx.begin_round(into).status());
    while (true) {
      FERRY_ASSIGN_OR_RETURN(auto segment, rx.next_segment());
      if (!segment) break;
      Status s = use(*segment);
      if (!s.ok()) return reader->abort(s);
    }
    return reader->stats();
  }

  // An empty round that ends the update still tells a bucket or segment callback so, once.
  template <class Say>
  Result<RoundStats> after_empty(Result<RoundStats> stats, Say&& say) {
    if (!stats.ok() || stats->buckets != 0 || stats->more_follows) return stats;
    Status s = say();
    if (!s.ok()) return reader->abort(s);
    return stats;
  }

  // A member's access to Receiver's impl_, for reader_of().
  static RoundReader& reader_of(Receiver& receiver) { return *receiver.impl_->reader; }
};

RoundReader& reader_of(Receiver& receiver) { return Receiver::Impl::reader_of(receiver); }

Receiver::Receiver(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Receiver::~Receiver() = default;

Result<std::unique_ptr<Receiver>> Receiver::connect(const std::string& address,
                                                    std::uint32_t receiver_id,
                                                    const SyncOptions& options,
                                                    std::uint64_t session) {
  auto impl = std::make_unique<Impl>();
  FERRY_ASSIGN_OR_RETURN(impl->reader,
                         join_session(address, JoinAs{"receiver", receiver_id, session}, options));
  return std::unique_ptr<Receiver>(new Receiver(std::move(impl)));
}

Status Receiver::set_destination(MutableTensorView destination) {
  return impl_->destinations.set(std::move(destination));
}

Status Receiver::set_destination(const TensorSlice& slice, std::span<std::byte> local) {
  return impl_->destinations.set(slice, local);
}

void Receiver::clear_destinations() { impl_->destinations.clear(); }

void Receiver::set_begin_check(BeginCheck check) {
  impl_->reader->set_begin_check(std::move(check));
}

void Receiver::set_min_step(std::uint64_t step) { impl_->reader->set_min_step(step); }

Result<RoundBegin> Receiver::begin_round(ReadInto into) {
  RoundReader& r = *impl_->reader;
  if (into == ReadInto::kPassThrough) {
    return invalid_argument(
        "begin_round: kPassThrough is a relay's; a receiver reads views, "
        "writable views or destinations");
  }
  if (r.status().ok() && r.in_round()) {
    return failed_precondition(fmt::format(
        "begin_round inside round {}: read it to its end (next_segment() until it returns no "
        "segment) or abort() it",
        r.last_round()));
  }
  FERRY_ASSIGN_OR_RETURN(RoundBegin begin, r.begin(into));
  if (into == ReadInto::kDestinations) {
    Status s = impl_->destinations.resolve(begin, r.tensors_generation());
    if (s.ok()) s = r.into(impl_->destinations.data(), impl_->destinations.slices());
    if (!s.ok()) return r.abort(s);
  }
  return begin;
}

Result<std::optional<ReadSegment>> Receiver::next_segment() { return impl_->reader->next(); }
Status Receiver::release(std::uint32_t bucket) { return impl_->reader->release(bucket); }
Status Receiver::abort(Status why) { return impl_->reader->abort(std::move(why)); }
const RoundStats& Receiver::round_stats() const { return impl_->reader->stats(); }

Result<RoundStats> Receiver::receive_round_into() {
  return impl_->read(*this, ReadInto::kDestinations, [&](const ReadSegment& s) {
    return s.bucket_ends ? impl_->reader->release(s.bucket) : ok_status();
  });
}

Result<RoundStats> Receiver::receive_round(const TensorCallback& on_tensor) {
  return impl_->read(*this, ReadInto::kViews, [&](const ReadSegment& s) {
    for (const TensorView& t : s.tensors) {
      Status st = on_tensor(t);
      if (!st.ok()) return st.with_context(fmt::format("tensor callback for '{}'", t.spec.name));
    }
    return s.bucket_ends ? impl_->reader->release(s.bucket) : ok_status();
  });
}

Result<RoundStats> Receiver::receive_round_buckets(const BucketCallback& on_bucket) {
  std::vector<TensorView> bucket;
  auto stats = impl_->read(*this, ReadInto::kViews, [&](const ReadSegment& s) {
    bucket.insert(bucket.end(), s.tensors.begin(), s.tensors.end());
    if (!s.bucket_ends) return ok_status();
    Status st = on_bucket(bucket, s.is_last);
    if (!st.ok()) return st.with_context(fmt::format("bucket callback for bucket {}", s.bucket));
    bucket.clear();
    return impl_->reader->release(s.bucket);
  });
  return impl_->after_empty(std::move(stats), [&] { return on_bucket({}, true); });
}

// The caller holds a bucket's views until the next bucket's callback returns: its slot is
// released then (the round's last bucket when its own callback returns).
Result<RoundStats> Receiver::receive_round_buckets_writable(
    const WritableBucketCallback& on_bucket) {
  std::vector<MutableTensorView> bucket;
  std::optional<std::uint32_t> held;
  auto stats = impl_->read(*this, ReadInto::kWritableViews, [&](const ReadSegment& s) {
    bucket.insert(bucket.end(), s.writable.begin(), s.writable.end());
    if (!s.bucket_ends) return ok_status();
    Status st = on_bucket(bucket, s.is_last, s.round_ends);
    if (!st.ok()) return st.with_context(fmt::format("bucket callback for bucket {}", s.bucket));
    bucket.clear();
    if (held) FERRY_RETURN_IF_ERROR(impl_->reader->release(*held));
    held = s.bucket;
    return s.round_ends ? impl_->reader->release(s.bucket) : ok_status();
  });
  return impl_->after_empty(std::move(stats), [&] { return on_bucket({}, true, true); });
}

Result<RoundStats> Receiver::receive_round_segments_writable(
    const WritableSegmentCallback& on_segment) {
  std::optional<std::uint32_t> held;
  auto stats = impl_->read(*this, ReadInto::kWritableViews, [&](const ReadSegment& s) {
    if (s.bucket_ends || !s.writable.empty()) {
      Status st = on_segment(WritableSegment{s.writable, s.bucket_ends, s.is_last, s.round_ends});
      if (!st.ok()) return st.with_context(fmt::format("segment callback for bucket {}", s.bucket));
    }
    if (!s.bucket_ends) return ok_status();
    if (held) FERRY_RETURN_IF_ERROR(impl_->reader->release(*held));
    held = s.bucket;
    return s.round_ends ? impl_->reader->release(s.bucket) : ok_status();
  });
  return impl_->after_empty(std::move(stats), [&] {
    return on_segment(WritableSegment{{}, true, true, true});
  });
}

Status Receiver::writable_views_error() { return impl_->reader->writable_views_error(); }
std::span<const std::byte> Receiver::ring_memory() const { return impl_->reader->ring_memory(); }
std::uint32_t Receiver::ring_slots() const { return impl_->reader->ring().slots(); }
std::uint64_t Receiver::session_id() const { return impl_->reader->session_id(); }
std::uint64_t Receiver::last_round() const { return impl_->reader->last_round(); }

}  // namespace ferry::sync
