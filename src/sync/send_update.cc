// Sender::send_update: one update of the caller's tensors, streamed into the ring when its
// manifest is the one the last update taught, else staged into rounds of a buffer (and the
// manifest learned), so a caller such as the verl backend has one send path.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <thread>
#include <unordered_set>
#include <utility>

#include "base/status_macros.h"
#include "ferry/sync.h"
#include "profiler/span.h"
#include "sync/sender_impl.h"

namespace ferry::sync {
namespace {

// One update (Sender::send_update) to one or more Senders: streamed against the manifest
// they learned from the last update, or staged.
class Update {
 public:
  Update(std::vector<Sender::Impl*> impls, const UpdateStream& next, const UpdateOptions& options)
      : impls_(std::move(impls)), next_(next), options_(options), stats_(impls_.size()) {}

  Result<std::vector<UpdateStats>> run() {
    profiler::Span span("sync.send_update");
    for (Sender::Impl* impl : impls_) FERRY_RETURN_IF_ERROR(impl->ready());
    // The first tensor is pulled before anything is sent: a manifest that changed there is
    // staged, in a correct round, instead of failing a streamed one.
    Result<std::optional<TensorView>> first = next_();
    if (!first.ok()) return first.status();  // nothing sent: the sessions are intact
    const std::optional<std::vector<TensorSpec>>& learned = impls_[0]->learned;
    bool stream = learned.has_value() && !learned->empty() && first->has_value() &&
                  (*first)->spec == learned->front();
    for (Sender::Impl* impl : impls_) stream = stream && !impl->codec && impl->learned == learned;
    Status s = stream ? streamed(**first) : staged(std::move(*first));
    if (!s.ok()) return s;
    for (UpdateStats& st : stats_) {
      st.bytes = bytes_;
      st.tensors = tensors_;
      st.streamed = stream;
    }
    return std::move(stats_);
  }

 private:
  // One round with the learned manifest, each tensor put into every writer as it is pulled.
  Status streamed(TensorView tensor) {
    const std::vector<TensorSpec> manifest = *impls_[0]->learned;
    for (Sender::Impl* impl : impls_) {
      Status s = impl->writer->begin(manifest, RoundOptions{false, options_.step});
      if (!s.ok()) return fail_all(s);
    }
    const std::size_t n = manifest.size();
    for (std::size_t i = 0; i < n; ++i) {
      if (i > 0) {
        Result<std::optional<TensorView>> r = next_();
        if (!r.ok()) {
          return fail_all(
              Status(r.status().code(),
                     fmt::format("tensor {} '{}': {}", i, manifest[i].name, r.status().message())));
        }
        if (!r->has_value()) {
          return fail_all(invalid_argument(
              fmt::format("the tensors ended before tensor {} '{}' (the manifest has {})", i,
                          manifest[i].name, n)));
        }
        tensor = std::move(**r);
      }
      if (tensor.spec != manifest[i]) {
        return fail_all(
            invalid_argument(fmt::format("tensor {} is {}, but the manifest has {} there", i,
                                         described(tensor.spec), described(manifest[i]))));
      }
      Status sized = check_bytes(tensor);
      if (!sized.ok()) return fail_all(sized);
      for (Sender::Impl* impl : impls_) {
        Status s = impl->writer->put(tensor.data);
        if (!s.ok()) return fail_all(s);
      }
      count(tensor);
    }
    Result<std::optional<TensorView>> rest = next_();
    if (!rest.ok()) return fail_all(rest.status());
    if (rest->has_value()) {
      return fail_all(invalid_argument(fmt::format(
          "tensor {} '{}' is one more than the {} of the manifest", n, (*rest)->spec.name, n)));
    }
    for (std::size_t k = 0; k < impls_.size(); ++k) {
      Result<RoundStats> stats = impls_[k]->writer->finish();
      if (!stats.ok()) return fail_all(stats.status());
      add(k, *stats);
    }
    return ok_status();
  }

  // Rounds of the tensors copied into the staging buffer; learns the manifest.
  Status staged(std::optional<TensorView> tensor) {
    constexpr std::uint64_t kAlign = 64;  // each copy's start: any dtype's view is aligned
    Sender::Impl& first = *impls_[0];
    if (first.staging_bytes != options_.staging_bytes) {  // faulted in as used, kept after
      first.staging.reset(new std::byte[options_.staging_bytes]);
      first.staging_bytes = options_.staging_bytes;
    }
    const std::span<std::byte> buffer(first.staging.get(), first.staging_bytes);
    std::vector<TensorSpec> manifest;
    std::unordered_set<std::string> names;  // of the whole update
    bool unique = true;
    std::vector<TensorView> round;
    std::unordered_set<std::string> in_round;
    std::uint64_t used = 0;
    const auto send = [&](bool more_follows) -> Status {
      FERRY_RETURN_IF_ERROR(send_everywhere(round, more_follows));
      round.clear();
      in_round.clear();
      used = 0;
      return ok_status();
    };
    while (tensor.has_value()) {
      TensorView& t = *tensor;
      Status sized = check_bytes(t);
      if (!sized.ok()) return fail_sent(sized);
      if (in_round.contains(t.spec.name)) FERRY_RETURN_IF_ERROR(send(true));  // a name twice
      if (unique && names.insert(t.spec.name).second) {
        manifest.push_back(t.spec);
      } else {
        unique = false;
      }
      count(t);
      const std::uint64_t size = t.data.size();
      std::uint64_t start = (used + kAlign - 1) / kAlign * kAlign;
      if (start + size > buffer.size() && !round.empty()) {
        FERRY_RETURN_IF_ERROR(send(true));
        start = 0;
      }
      if (start + size <= buffer.size()) {
        if (size != 0) std::memcpy(buffer.data() + start, t.data.data(), size);
        in_round.insert(t.spec.name);
        round.push_back({std::move(t.spec), {buffer.data() + start, size}});
        used = start + size;
      } else {  // larger than the buffer: alone, from the caller's memory, before the next pull
        round.push_back(std::move(t));
        FERRY_RETURN_IF_ERROR(send(true));
      }
      Result<std::optional<TensorView>> r = next_();
      if (!r.ok()) return fail_sent(r.status());
      tensor = std::move(*r);
    }
    FERRY_RETURN_IF_ERROR(send(false));
    for (Sender::Impl* impl : impls_) {
      if (unique) {
        impl->learned = manifest;
      } else {
        impl->learned.reset();
      }
    }
    return ok_status();
  }

  // One staged round to every Sender, each in its own thread after the first.
  Status send_everywhere(std::span<const TensorView> round, bool more_follows) {
    const RoundOptions options{more_follows, options_.step};
    std::vector<std::optional<Result<RoundStats>>> results(impls_.size());
    std::vector<std::thread> threads;
    for (std::size_t k = 1; k < impls_.size(); ++k) {
      threads.emplace_back([&, k] { results[k].emplace(impls_[k]->send_views(round, options)); });
    }
    results[0].emplace(impls_[0]->send_views(round, options));
    for (std::thread& t : threads) t.join();
    for (std::size_t k = 0; k < impls_.size(); ++k) sent_ = sent_ || results[k]->ok();
    for (std::size_t k = 0; k < impls_.size(); ++k) {
      if (!results[k]->ok()) return fail_sent(results[k]->status());
    }
    for (std::size_t k = 0; k < impls_.size(); ++k) add(k, **results[k]);
    sent_ = true;
    return ok_status();
  }

  // 'name' BF16[64, 96], as Python writes a spec.
  static std::string described(const TensorSpec& spec) {
    return fmt::format("'{}' {}[{}]", spec.name, dtype_name(spec.dtype),
                       fmt::join(spec.shape, ", "));
  }

  static Status check_bytes(const TensorView& t) {
    if (t.data.size() == t.spec.bytes()) return ok_status();
    return (invalid_argument(fmt::format("tensor '{}': {} bytes given, {} needs {}", t.spec.name,
                                         t.data.size(), t.spec.to_string(), t.spec.bytes())));
  }

  void count(const TensorView& t) {
    bytes_ += t.data.size();
    ++tensors_;
  }

  void add(std::size_t k, const RoundStats& round) {
    ++stats_[k].rounds;
    stats_[k].seconds += round.seconds;
  }

  // Breaks every session: their receivers are mid-update.
  Status fail_all(Status why) {
    for (Sender::Impl* impl : impls_) (void)impl->fail(why);
    return why;
  }

  // An error once a round went out breaks every session; before, it leaves them intact.
  Status fail_sent(Status why) {
    if (sent_ || begun()) return fail_all(std::move(why));
    return why;
  }

  bool begun() const {
    for (const Sender::Impl* impl : impls_) {
      if (!impl->broken.ok()) return true;  // a round of this update failed in it
    }
    return false;
  }

  std::vector<Sender::Impl*> impls_;
  const UpdateStream& next_;
  const UpdateOptions& options_;
  std::vector<UpdateStats> stats_;
  std::uint64_t bytes_ = 0;
  std::uint32_t tensors_ = 0;
  bool sent_ = false;  // a staged round went out
};

}  // namespace

Result<UpdateStats> Sender::send_update(const UpdateStream& next, const UpdateOptions& options) {
  Sender* self = this;
  FERRY_ASSIGN_OR_RETURN(std::vector<UpdateStats> stats,
                         send_update(std::span<Sender* const>(&self, 1), next, options));
  return stats.front();
}

Result<std::vector<UpdateStats>> Sender::send_update(std::span<Sender* const> senders,
                                                     const UpdateStream& next,
                                                     const UpdateOptions& options) {
  if (senders.empty()) return invalid_argument("send_update: no Sender given");
  std::vector<Impl*> impls;
  for (Sender* s : senders) {
    if (std::find(impls.begin(), impls.end(), s->impl_.get()) != impls.end()) {
      return invalid_argument(
          fmt::format("send_update: the Sender on {} is given twice", s->address()));
    }
    impls.push_back(s->impl_.get());
  }
  return Update(std::move(impls), next, options).run();
}

const std::optional<std::vector<TensorSpec>>& Sender::update_manifest() const {
  return impl_->learned;
}

}  // namespace ferry::sync
