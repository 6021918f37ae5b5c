#include <fmt/format.h>
#include <poll.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <string_view>
#include <unordered_set>
#include <utility>

#include "base/clock.h"
#include "base/log.h"
#include "base/random.h"
#include "base/status_macros.h"
#include "codec/registry.h"
#include "ferry/sync.h"
#include "profiler/span.h"
#include "sync/bucket_planner.h"
#include "sync/copy.h"
#include "sync/fanout.h"
#include "sync/round_writer.h"
#include "sync/sender_impl.h"
#include "sync/sync_options.h"
#include "wire/conversation.h"
#include "wire/message.h"

namespace ferry::sync {
namespace {

std::uint64_t random_session() {
  std::uint64_t v = 0;
  while (v == 0) v = random_u64();
  return v;
}

// Checks a round's tensors before anything is sent: a bad one leaves the session intact.
template <class Size>
Result<std::vector<TensorSpec>> round_manifest(std::size_t count, Size&& spec_and_bytes) {
  std::vector<TensorSpec> specs;
  specs.reserve(count);
  std::unordered_set<std::string_view> names;
  names.reserve(count);
  for (std::size_t i = 0; i < count; ++i) {
    const auto [spec, given] = spec_and_bytes(i);
    if (given != spec->bytes()) {
      return invalid_argument(fmt::format("tensor '{}': {} bytes given, {} needs {}", spec->name,
                                          given, spec->to_string(), spec->bytes()));
    }
    if (!names.insert(spec->name).second) {
      return invalid_argument(fmt::format("tensor '{}' appears twice in the round", spec->name));
    }
    specs.push_back(*spec);
  }
  return specs;
}

Result<std::vector<TensorSpec>> manifest_of(std::span<const TensorView> views) {
  return round_manifest(views.size(), [&](std::size_t i) {
    return std::pair(&views[i].spec, static_cast<std::uint64_t>(views[i].data.size()));
  });
}

Result<std::vector<TensorSpec>> manifest_of(std::span<const GatheredTensor> tensors) {
  return round_manifest(tensors.size(), [&](std::size_t i) {
    std::uint64_t given = 0;
    for (const auto& part : tensors[i].parts) given += part.size();
    return std::pair(&tensors[i].spec, given);
  });
}

Status put_gathered(RoundWriter& w, std::span<const GatheredTensor> tensors) {
  for (const GatheredTensor& t : tensors) {
    for (const auto& part : t.parts) FERRY_RETURN_IF_ERROR(w.put(part));
  }
  return ok_status();
}

}  // namespace

Result<RoundStats> Sender::Impl::send_views(std::span<const TensorView> weights,
                                            const RoundOptions& round_options) {
  if (codec) {
    std::vector<GatheredTensor> tensors;
    tensors.reserve(weights.size());
    for (const TensorView& w : weights) tensors.push_back(GatheredTensor{w.spec, {w.data}});
    return send_encoded(tensors, round_options);
  }
  return send(manifest_of(weights), round_options, [&](RoundWriter& w) {
    for (const TensorView& t : weights) FERRY_RETURN_IF_ERROR(w.put(t.data));
    return ok_status();
  });
}

Result<RoundStats> Sender::Impl::send_encoded(std::span<const GatheredTensor> tensors,
                                              const RoundOptions& round_options) {
  const auto start = Clock::now();  // the round's time includes encoding it
  auto encoded = codec->encode(tensors, fanout->all_peers_share_memory());
  if (!encoded.ok()) return encoded.status();
  wire::Begin fields;
  fields.keep_copies = static_cast<std::uint8_t>(encoded->keep_copies);
  fields.codec = encoded->codec;
  fields.base_version = encoded->base_version;
  fields.targets = std::move(encoded->targets);
  const std::span<const GatheredTensor> sent =
      encoded->codec != wire::kDense ? std::span<const GatheredTensor>(encoded->payloads) : tensors;
  auto stats = send(
      manifest_of(sent), round_options, [&](RoundWriter& w) { return put_gathered(w, sent); },
      std::move(fields));
  codec->round_sent(stats.ok(), stats.ok() ? stats->version : 0);
  if (!stats.ok()) return stats;
  stats->seconds = std::chrono::duration<double>(Clock::now() - start).count();
  if (stats->delta) {
    stats->bytes = 0;
    for (const GatheredTensor& t : tensors) stats->bytes += t.spec.bytes();
  }
  return stats;
}

Sender::Sender(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Sender::~Sender() { abort_open_update(impl_.get()); }

Result<std::unique_ptr<Sender>> Sender::create(const std::string& address,
                                               const SyncOptions& options) {
  Status s = validate_options(options);
  if (!s.ok()) return s;
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  auto fanout = Fanout::create(address, options, options.slots, options.bucket_bytes);
  if (!fanout.ok()) return fanout.status();
  impl->fanout = std::move(*fanout);
  impl->fanout->set_session(random_session());
  impl->writer = std::make_unique<RoundWriter>(impl->fanout.get(), options);
  impl->codec = codec::make_send_codec(options);
  return std::unique_ptr<Sender>(new Sender(std::move(impl)));
}

Status Sender::accept(std::uint32_t receivers) {
  FERRY_RETURN_IF_ERROR(impl_->no_open_update());
  if (!impl_->broken.ok()) {
    // After a failure, peers join a new session on the same address and ring.
    log::info("sync: starting a new session on {} after: {}", impl_->fanout->address(),
              impl_->broken.message());
    impl_->fanout->drop_peers();
    impl_->fanout->set_session(random_session());
    impl_->broken = ok_status();
  }
  // A receiver that joins holds nothing yet: the next round goes dense.
  if (impl_->codec) impl_->codec->reset();
  return impl_->fanout->accept(receivers);
}

Result<RoundStats> Sender::send_round(std::span<const TensorView> weights,
                                      const RoundOptions& round_options) {
  FERRY_RETURN_IF_ERROR(impl_->ready());
  return impl_->send_views(weights, round_options);
}

Result<RoundStats> Sender::send_round_gathered(std::span<const GatheredTensor> weights,
                                               const RoundOptions& round_options) {
  FERRY_RETURN_IF_ERROR(impl_->ready());
  if (impl_->codec) return impl_->send_encoded(weights, round_options);
  return impl_->send(manifest_of(weights), round_options,
                     [&](RoundWriter& w) { return put_gathered(w, weights); });
}

std::span<std::byte> Sender::ring_memory() const { return impl_->fanout->ring().memory(); }

std::uint64_t Sender::session_id() const { return impl_->fanout->session(); }
std::uint64_t Sender::rounds_sent() const { return impl_->writer->round(); }
std::uint32_t Sender::receivers() const {
  return static_cast<std::uint32_t>(impl_->fanout->peers().size());
}
const std::string& Sender::address() const { return impl_->fanout->address(); }

}  // namespace ferry::sync
