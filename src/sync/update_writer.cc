// UpdateWriter: one update pushed a tensor at a time, streamed into the ring when its manifest
// is the one the last update taught, else staged into rounds of a buffer (and the manifest
// learned), so a caller such as the verl backend has one send path. Sender::send_update is a
// loop over it.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstring>
#include <memory>
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

// 'name' BF16[64, 96], as Python writes a spec.
std::string described(const TensorSpec& spec) {
  return fmt::format("'{}' {}[{}]", spec.name, dtype_name(spec.dtype), fmt::join(spec.shape, ", "));
}

Status check_bytes(std::size_t index, const TensorView& t) {
  if (t.data.size() == t.spec.bytes()) return ok_status();
  return invalid_argument(fmt::format("tensor {} '{}': {} bytes given, {} needs {}", index,
                                      t.spec.name, t.data.size(), t.spec.to_string(),
                                      t.spec.bytes()));
}

// A producer's or flush's error, which names no tensor, naming tensor `index`.
Status about_tensor(std::size_t index, const TensorSpec& spec, const Status& s) {
  if (s.ok()) return s;
  return Status(s.code(), fmt::format("tensor {} '{}': {}", index, spec.name, s.message()));
}

// One tensor as put() gets it: its bytes in memory, or a producer that writes them.
struct Source {
  const TensorSpec& spec;
  std::span<const std::byte> data;          // in memory
  const TensorProducer* produce = nullptr;  // or written by the producer

  std::uint64_t bytes() const { return produce != nullptr ? spec.bytes() : data.size(); }

  // Writes the bytes into `dst`, a producer's copies waited for with `flush`.
  Status copy_to(std::span<std::byte> dst, const FillFlush& flush) const {
    if (produce == nullptr) {
      if (!dst.empty()) std::memcpy(dst.data(), data.data(), dst.size());
      return ok_status();
    }
    if (dst.empty()) return ok_status();  // nothing to produce
    FERRY_RETURN_IF_ERROR((*produce)(0, dst));
    return flush();
  }
};

}  // namespace

struct UpdateWriter::Impl {
  enum class Mode { kUndecided, kStreamed, kStaged, kEnded };

  Impl(std::vector<Sender::Impl*> senders, const UpdateOptions& update_options)
      : impls(std::move(senders)), options(update_options), stats(impls.size()) {}
  ~Impl() { close(); }

  // Claims the Senders: each must be able to start a round.
  Status open() {
    for (Sender::Impl* impl : impls) FERRY_RETURN_IF_ERROR(impl->ready());
    for (Sender::Impl* impl : impls) impl->open_update = this;
    return ok_status();
  }

  // Releases the Senders; the update is over. It forgets them: a Sender may be destroyed
  // right after (abort_open_update).
  void close() {
    for (Sender::Impl* impl : impls) {
      if (impl->open_update == this) impl->open_update = nullptr;
    }
    impls.clear();
    mode = Mode::kEnded;
  }

  // One round with `specs`, each tensor put into every writer as it comes.
  Status start_streamed(std::vector<TensorSpec> specs, const RoundOptions& round_options) {
    mode = Mode::kStreamed;
    manifest = std::move(specs);
    for (Sender::Impl* impl : impls) {
      const std::uint64_t before = impl->writer->round();
      Status s = impl->writer->begin(manifest, round_options);
      if (!s.ok()) return impl->writer->round() == before && !begun() ? end(s) : fail_all(s);
      begun_ = true;
    }
    return ok_status();
  }

  Status put(const Source& tensor) {
    if (mode == Mode::kEnded) return ended_error();
    if (tensor.produce != nullptr && !options.flush) {
      return invalid_argument(fmt::format(
          "tensor '{}': a tensor with a producer needs UpdateOptions::flush", tensor.spec.name));
    }
    if (mode == Mode::kUndecided) {
      const std::optional<std::vector<TensorSpec>>& learned = impls[0]->learned;
      bool stream = learned.has_value() && !learned->empty() && tensor.spec == learned->front();
      for (Sender::Impl* impl : impls) stream = stream && !impl->codec && impl->learned == learned;
      if (stream) {
        FERRY_RETURN_IF_ERROR(start_streamed(*learned, RoundOptions{false, options.step}));
      } else {
        start_staged();
      }
    }
    return mode == Mode::kStreamed ? put_streamed(tensor) : put_staged(tensor);
  }

  Result<std::vector<UpdateStats>> finish() {
    if (mode == Mode::kEnded) return ended_error();
    if (mode == Mode::kUndecided) start_staged();  // no tensor: one empty round
    if (mode == Mode::kStreamed) {
      if (next < manifest.size()) {
        return fail_all(invalid_argument(
            fmt::format("the tensors ended before tensor {} '{}' (the manifest has {})", next,
                        manifest[next].name, manifest.size())));
      }
      for (std::size_t k = 0; k < impls.size(); ++k) {
        Result<RoundStats> sent = impls[k]->writer->finish();
        if (!sent.ok()) return fail_all(sent.status());
        add(k, *sent);
      }
    } else {
      FERRY_RETURN_IF_ERROR(send_staged(false));
      for (Sender::Impl* impl : impls) {
        if (unique) {
          impl->learned = staged_manifest;
        } else {
          impl->learned.reset();
        }
      }
    }
    for (UpdateStats& st : stats) {
      st.bytes = bytes;
      st.tensors = tensors;
      st.streamed = mode == Mode::kStreamed;
    }
    close();
    return std::move(stats);
  }

  void abort(const Status& why) {
    switch (mode) {
      case Mode::kEnded:
        return;
      case Mode::kUndecided:
        (void)end(why);
        return;
      case Mode::kStreamed:  // the round is open: its receivers hear which tensor failed
        if (next < manifest.size()) {
          (void)fail_all(Status(why.code(), fmt::format("tensor {} '{}': {}", next,
                                                        manifest[next].name, why.message())));
        } else {
          (void)fail_all(why);
        }
        return;
      case Mode::kStaged:
        (void)fail_sent(why);
        return;
    }
  }

 private:
  Status put_streamed(const Source& tensor) {
    const std::size_t n = manifest.size();
    if (next == n) {
      return fail_all(invalid_argument(fmt::format(
          "tensor {} '{}' is one more than the {} of the manifest", n, tensor.spec.name, n)));
    }
    if (tensor.spec != manifest[next]) {
      return fail_all(
          invalid_argument(fmt::format("tensor {} is {}, but the manifest has {} there", next,
                                       described(tensor.spec), described(manifest[next]))));
    }
    if (tensor.produce == nullptr) {
      Status sized = check_bytes(next, TensorView{tensor.spec, tensor.data});
      if (!sized.ok()) return fail_all(sized);
    }
    for (Sender::Impl* impl : impls) {
      const Status s =
          tensor.produce != nullptr
              ? about_tensor(next, tensor.spec,
                             impl->writer->produce(tensor.bytes(), *tensor.produce, options.flush))
              : impl->writer->put(tensor.data);
      if (!s.ok()) return fail_all(s);
    }
    ++next;
    count(tensor.bytes());
    return ok_status();
  }

  void start_staged() {
    mode = Mode::kStaged;
    Sender::Impl& first = *impls[0];
    if (first.staging_bytes != options.staging_bytes) {  // faulted in as used, kept after
      first.staging.reset(new std::byte[options.staging_bytes]);
      first.staging_bytes = options.staging_bytes;
    }
    buffer = std::span<std::byte>(first.staging.get(), first.staging_bytes);
  }

  // Copies the tensor into the staging buffer, first sending the round it holds when the
  // tensor does not fit or its name is in it already; a tensor larger than the buffer is sent
  // alone, from the caller's memory (or a copy, for a producer's), before this returns.
  Status put_staged(const Source& t) {
    constexpr std::uint64_t kAlign = 64;  // each copy's start: any dtype's view is aligned
    const std::size_t index = tensors;
    if (t.produce == nullptr) {
      Status sized = check_bytes(tensors, TensorView{t.spec, t.data});
      if (!sized.ok()) return fail_sent(sized);
    }
    if (in_round.contains(t.spec.name)) FERRY_RETURN_IF_ERROR(send_staged(true));  // a name twice
    if (unique && names.insert(t.spec.name).second) {
      staged_manifest.push_back(t.spec);
    } else {
      unique = false;
    }
    const std::uint64_t size = t.bytes();
    count(size);
    std::uint64_t start = (used + kAlign - 1) / kAlign * kAlign;
    if (start + size > buffer.size() && !staged.empty()) {
      FERRY_RETURN_IF_ERROR(send_staged(true));
      start = 0;
    }
    if (start + size <= buffer.size()) {
      const std::span<std::byte> dst = buffer.subspan(start, size);
      Status copied = about_tensor(index, t.spec, t.copy_to(dst, options.flush));
      if (!copied.ok()) return fail_sent(copied);
      in_round.insert(t.spec.name);
      staged.push_back({t.spec, dst});
      used = start + size;
      return ok_status();
    }
    std::unique_ptr<std::byte[]> whole;  // a producer's tensor, larger than the buffer
    std::span<const std::byte> alone = t.data;
    if (t.produce != nullptr) {
      whole = std::make_unique_for_overwrite<std::byte[]>(size);  // not zeroed: all produced
      Status copied = about_tensor(index, t.spec, t.copy_to({whole.get(), size}, options.flush));
      if (!copied.ok()) return fail_sent(copied);
      alone = {whole.get(), size};
    }
    staged.push_back({t.spec, alone});
    return send_staged(true);
  }

  // The staged round to every Sender, each in its own thread after the first.
  Status send_staged(bool more_follows) {
    const RoundOptions round_options{more_follows, options.step};
    std::vector<std::optional<Result<RoundStats>>> results(impls.size());
    std::vector<std::thread> threads;
    for (std::size_t k = 1; k < impls.size(); ++k) {
      threads.emplace_back(
          [&, k] { results[k].emplace(impls[k]->send_views(staged, round_options)); });
    }
    results[0].emplace(impls[0]->send_views(staged, round_options));
    for (std::thread& t : threads) t.join();
    staged.clear();
    in_round.clear();
    used = 0;
    for (std::size_t k = 0; k < impls.size(); ++k) begun_ = begun_ || results[k]->ok();
    for (std::size_t k = 0; k < impls.size(); ++k) {
      if (!results[k]->ok()) return fail_sent(results[k]->status());
    }
    for (std::size_t k = 0; k < impls.size(); ++k) add(k, **results[k]);
    begun_ = true;
    return ok_status();
  }

  void count(std::uint64_t n) {
    bytes += n;
    ++tensors;
  }

  void add(std::size_t k, const RoundStats& r) {
    ++stats[k].rounds;
    stats[k].seconds += r.seconds;
    stats[k].last_round = r;
  }

  // Ends the update without touching the sessions.
  Status end(Status why) {
    close();
    ended = why;
    return why;
  }

  // Breaks every session: their receivers are mid-update.
  Status fail_all(Status why) {
    for (Sender::Impl* impl : impls) (void)impl->fail(why);
    return end(std::move(why));
  }

  // An error once a round went out breaks every session; before, it leaves them intact.
  Status fail_sent(Status why) {
    if (begun()) return fail_all(std::move(why));
    return end(std::move(why));
  }

  bool begun() const {
    if (begun_) return true;
    for (const Sender::Impl* impl : impls) {
      if (!impl->broken.ok()) return true;  // a round of this update failed in it
    }
    return false;
  }

  Status ended_error() const {
    if (ended.ok()) return failed_precondition("the update has finished");
    return failed_precondition("the update ended: " + ended.to_string());
  }

  std::vector<Sender::Impl*> impls;
  const UpdateOptions options;
  std::vector<UpdateStats> stats;
  Mode mode = Mode::kUndecided;
  Status ended;         // why it ended early
  bool begun_ = false;  // a round of the update went out (or began)
  std::uint64_t bytes = 0;
  std::uint32_t tensors = 0;

  // Streamed: the round's manifest and the index of the next tensor.
  std::vector<TensorSpec> manifest;
  std::size_t next = 0;

  // Staged: the buffer, the round it holds, and the manifest learned so far.
  std::span<std::byte> buffer;
  std::vector<TensorView> staged;  // the round the buffer holds
  std::unordered_set<std::string> in_round;
  std::uint64_t used = 0;
  std::vector<TensorSpec> staged_manifest;
  std::unordered_set<std::string> names;  // of the whole update
  bool unique = true;
};

UpdateWriter::UpdateWriter(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

UpdateWriter::~UpdateWriter() {
  impl_->abort(aborted("the update was dropped before it finished"));
}

Result<std::unique_ptr<UpdateWriter>> UpdateWriter::begin(std::span<Sender* const> senders,
                                                          const UpdateOptions& options) {
  if (senders.empty()) return invalid_argument("send_update: no Sender given");
  std::vector<Sender::Impl*> impls;
  for (Sender* s : senders) {
    if (std::find(impls.begin(), impls.end(), s->impl_.get()) != impls.end()) {
      return invalid_argument(
          fmt::format("send_update: the Sender on {} is given twice", s->address()));
    }
    impls.push_back(s->impl_.get());
  }
  auto impl = std::make_unique<Impl>(std::move(impls), options);
  FERRY_RETURN_IF_ERROR(impl->open());
  return std::unique_ptr<UpdateWriter>(new UpdateWriter(std::move(impl)));
}

Result<std::unique_ptr<UpdateWriter>> UpdateWriter::begin_round(Sender* sender,
                                                                std::span<const TensorSpec> specs,
                                                                const RoundOptions& options,
                                                                FillFlush flush) {
  std::unordered_set<std::string_view> names;
  for (const TensorSpec& spec : specs) {
    if (!names.insert(spec.name).second) {
      return invalid_argument(fmt::format("tensor '{}' appears twice in the round", spec.name));
    }
  }
  UpdateOptions update_options;
  update_options.step = options.step;
  update_options.flush = std::move(flush);
  auto impl =
      std::make_unique<Impl>(std::vector<Sender::Impl*>{sender->impl_.get()}, update_options);
  FERRY_RETURN_IF_ERROR(impl->open());
  FERRY_RETURN_IF_ERROR(
      impl->start_streamed(std::vector<TensorSpec>(specs.begin(), specs.end()), options));
  return std::unique_ptr<UpdateWriter>(new UpdateWriter(std::move(impl)));
}

Status UpdateWriter::put(const TensorView& tensor) {
  return impl_->put(Source{tensor.spec, tensor.data});
}
Status UpdateWriter::put(const TensorSpec& spec, const TensorProducer& produce) {
  return impl_->put(Source{spec, {}, &produce});
}
Result<std::vector<UpdateStats>> UpdateWriter::finish() { return impl_->finish(); }
void UpdateWriter::abort(const Status& why) { impl_->abort(why); }

void abort_open_update(Sender::Impl* sender) {
  if (sender->open_update != nullptr) {
    sender->open_update->abort(aborted("a Sender of the update was closed before it ended"));
  }
}

Result<UpdateStats> Sender::send_update(const UpdateStream& next, const UpdateOptions& options) {
  Sender* self = this;
  FERRY_ASSIGN_OR_RETURN(std::vector<UpdateStats> stats,
                         send_update(std::span<Sender* const>(&self, 1), next, options));
  return stats.front();
}

Result<std::vector<UpdateStats>> Sender::send_update(std::span<Sender* const> senders,
                                                     const UpdateStream& next,
                                                     const UpdateOptions& options) {
  profiler::Span span("sync.send_update");
  FERRY_ASSIGN_OR_RETURN(std::unique_ptr<UpdateWriter> update,
                         UpdateWriter::begin(senders, options));
  for (;;) {
    Result<std::optional<TensorView>> tensor = next();
    if (!tensor.ok()) {
      update->abort(tensor.status());
      return tensor.status();
    }
    if (!tensor->has_value()) return update->finish();
    FERRY_RETURN_IF_ERROR(update->put(**tensor));
  }
}

const std::optional<std::vector<TensorSpec>>& Sender::update_manifest() const {
  return impl_->learned;
}

}  // namespace ferry::sync
