#include <fmt/format.h>

#include <unordered_map>

#include "base/status_macros.h"
#include "ferry/sync.h"
#include "sync/join.h"
#include "sync/round_reader.h"

// Each delivery mode is a loop over the session's RoundReader (sync/round_reader.h).
namespace ferry::sync {

struct Receiver::Impl {
  std::unique_ptr<RoundReader> reader;
  std::unordered_map<std::string, MutableTensorView> destinations;
  // Rank-local destinations, by the whole tensor's name: the data is in `destinations`.
  std::unordered_map<std::string, TensorSlice> slices;
  // Where round tensor i goes, valid while resolved_generation matches the reader's.
  std::vector<std::byte*> destination_data;
  std::vector<const TensorSlice*> destination_slices;  // empty when no destination is a slice
  std::optional<std::uint64_t> resolved_generation;

  // Finds each round tensor's destination, once per change of the round's tensors or of the
  // registrations: a round of 20,000 small tensors must not look up 20,000 names.
  Status resolve_destinations(const RoundBegin& begin) {
    if (resolved_generation == reader->tensors_generation()) return ok_status();
    std::vector<std::string> problems;
    destination_data.assign(begin.tensors.size(), nullptr);
    destination_slices.assign(slices.empty() ? 0 : begin.tensors.size(), nullptr);
    for (std::size_t i = 0; i < begin.tensors.size(); ++i) {
      const TensorSpec& spec = begin.tensors[i];
      auto it = destinations.find(spec.name);
      if (it == destinations.end()) {
        problems.push_back(
            fmt::format("missing destination for '{}' ({})", spec.name, spec.to_string()));
        continue;
      }
      destination_data[i] = it->second.data.data();
      const TensorSpec* whole = &it->second.spec;
      if (auto slice = slices.find(spec.name); slice != slices.end()) {
        destination_slices[i] = &slice->second;
        whole = &slice->second.whole;
      }
      const TensorSpec& d = *whole;
      if (d.dtype != spec.dtype || d.shape != spec.shape) {
        problems.push_back(fmt::format("'{}': sender sends {} {}, destination is {} {}", spec.name,
                                       spec.shape_string(), dtype_name(spec.dtype),
                                       d.shape_string(), dtype_name(d.dtype)));
      }
    }
    if (problems.empty()) {
      resolved_generation = reader->tensors_generation();
      return ok_status();
    }
    std::string text = fmt::format(
        "round {}: {} manifest mismatch(es) in destination mode:", begin.round, problems.size());
    for (const std::string& p : problems) text += "\n  " + p;
    return invalid_argument(text);
  }

  // Runs one round read `into`, handing each segment to `use`; the caller's errors abort the
  // round as the reader's do.
  template <class Use>
  Result<RoundStats> read(ReadInto into, Use&& use) {
    FERRY_ASSIGN_OR_RETURN(auto begin, reader->begin(into));
    if (into == ReadInto::kDestinations) {
      Status s = resolve_destinations(begin);
      if (s.ok()) s = reader->into(destination_data, destination_slices);
      if (!s.ok()) return reader->abort(s);
    }
    while (true) {
      FERRY_ASSIGN_OR_RETURN(auto segment, reader->next());
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
  if (destination.data.size() != destination.spec.bytes()) {
    return invalid_argument(fmt::format("destination '{}': {} bytes given, {} needs {}",
                                        destination.spec.name, destination.data.size(),
                                        destination.spec.to_string(), destination.spec.bytes()));
  }
  std::string name = destination.spec.name;
  impl_->slices.erase(name);
  impl_->destinations.insert_or_assign(std::move(name), std::move(destination));
  impl_->resolved_generation.reset();
  return ok_status();
}

Status Receiver::set_destination(const TensorSlice& slice, std::span<std::byte> local) {
  FERRY_RETURN_IF_ERROR(slice.check());
  if (local.size() != slice.local.bytes()) {
    return invalid_argument(
        fmt::format("destination for the slice '{}' of {}: {} bytes given, {} "
                    "needs {}",
                    slice.local.name, slice.whole.to_string(), local.size(),
                    slice.local.to_string(), slice.local.bytes()));
  }
  const std::string& name = slice.whole.name;
  impl_->destinations.insert_or_assign(name, MutableTensorView{slice.local, local});
  impl_->slices.insert_or_assign(name, slice);
  impl_->resolved_generation.reset();
  return ok_status();
}

void Receiver::clear_destinations() {
  impl_->destinations.clear();
  impl_->slices.clear();
  impl_->resolved_generation.reset();
}

void Receiver::set_begin_check(BeginCheck check) {
  impl_->reader->set_begin_check(std::move(check));
}

void Receiver::set_min_step(std::uint64_t step) { impl_->reader->set_min_step(step); }

Result<RoundStats> Receiver::receive_round_into() {
  return impl_->read(ReadInto::kDestinations, [&](const ReadSegment& s) {
    return s.bucket_ends ? impl_->reader->release(s.bucket) : ok_status();
  });
}

Result<RoundStats> Receiver::receive_round(const TensorCallback& on_tensor) {
  return impl_->read(ReadInto::kViews, [&](const ReadSegment& s) {
    for (const TensorView& t : s.tensors) {
      Status st = on_tensor(t);
      if (!st.ok()) return st.with_context(fmt::format("tensor callback for '{}'", t.spec.name));
    }
    return s.bucket_ends ? impl_->reader->release(s.bucket) : ok_status();
  });
}

Result<RoundStats> Receiver::receive_round_buckets(const BucketCallback& on_bucket) {
  std::vector<TensorView> bucket;
  auto stats = impl_->read(ReadInto::kViews, [&](const ReadSegment& s) {
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
  auto stats = impl_->read(ReadInto::kWritableViews, [&](const ReadSegment& s) {
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
  auto stats = impl_->read(ReadInto::kWritableViews, [&](const ReadSegment& s) {
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
std::uint64_t Receiver::session_id() const { return impl_->reader->session_id(); }
std::uint64_t Receiver::last_round() const { return impl_->reader->last_round(); }

}  // namespace ferry::sync
