#include <fmt/format.h>
#include <poll.h>
#include <sys/random.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <unordered_set>

#include "ferry/sync.h"
#include "profiler/span.h"
#include "sync/bucket_planner.h"
#include "sync/round_stats.h"
#include "sync/copy.h"
#include "sync/round_checksum.h"
#include "sync/segment.h"
#include "sync/sync_options.h"
#include "transport/shm/memfd_ring.h"
#include "transport/shm/seqpacket_channel.h"
#include "wire/conversation.h"
#include "wire/message.h"

namespace ferry::sync {
namespace {

using Clock = std::chrono::steady_clock;

std::uint64_t random_session() {
  std::uint64_t v = 0;
  while (v == 0) {
    if (::getrandom(&v, sizeof v, 0) != static_cast<ssize_t>(sizeof v)) {
      v = static_cast<std::uint64_t>(Clock::now().time_since_epoch().count()) ^
          (static_cast<std::uint64_t>(::getpid()) << 32);
    }
  }
  return v;
}

// The caller's tensors as send_round reads them: for_each_run(i, offset, n, f) calls
// f(pointer, length) for the contiguous runs holding bytes [offset, offset + n) of tensor i.
struct ViewSource {
  std::span<const TensorView> views;
  std::size_t size() const { return views.size(); }
  const TensorSpec& spec(std::size_t i) const { return views[i].spec; }
  std::uint64_t bytes_given(std::size_t i) const { return views[i].data.size(); }
  template <class F>
  void for_each_run(std::size_t i, std::uint64_t offset, std::uint64_t n, F&& f) const {
    f(views[i].data.data() + offset, n);
  }
};

struct GatheredSource {
  std::span<const GatheredTensor> tensors;
  std::vector<std::vector<std::uint64_t>> starts;  // starts[i][j]: offset of parts[j] in tensor i

  explicit GatheredSource(std::span<const GatheredTensor> t) : tensors(t) {
    starts.reserve(t.size());
    for (const GatheredTensor& g : t) {
      std::vector<std::uint64_t> at;
      at.reserve(g.parts.size() + 1);
      std::uint64_t sum = 0;
      for (const auto& part : g.parts) {
        at.push_back(sum);
        sum += part.size();
      }
      at.push_back(sum);
      starts.push_back(std::move(at));
    }
  }
  std::size_t size() const { return tensors.size(); }
  const TensorSpec& spec(std::size_t i) const { return tensors[i].spec; }
  std::uint64_t bytes_given(std::size_t i) const { return starts[i].back(); }
  template <class F>
  void for_each_run(std::size_t i, std::uint64_t offset, std::uint64_t n, F&& f) const {
    const std::vector<std::uint64_t>& at = starts[i];
    // The last part that starts at or before `offset`.
    std::size_t j = static_cast<std::size_t>(std::upper_bound(at.begin(), at.end() - 1, offset) -
                                             at.begin()) - 1;
    while (n > 0) {
      const auto& part = tensors[i].parts[j];
      const std::uint64_t in_part = offset - at[j];
      const std::uint64_t len = std::min<std::uint64_t>(n, part.size() - in_part);
      if (len > 0) f(part.data() + in_part, len);
      offset += len;
      n -= len;
      ++j;
    }
  }
};

struct Peer {
  shm::Channel channel;
  wire::Conversation conversation;
  std::uint32_t id = 0;
  std::uint32_t released = 0;  // buckets released this round
  bool acked = false;
};

}  // namespace

struct Sender::Impl {
  SyncOptions options;
  shm::Listener listener;
  shm::MemfdRing ring;
  std::uint64_t session = 0;
  std::uint64_t round = 0;
  std::vector<Peer> peers;
  Status broken;  // the first error; the session is unusable after it
  std::vector<TensorSpec> manifest;
  BucketPlan plan;
  std::function<void(std::uint32_t, std::byte*)> corrupt_hook;

  wire::Message message(wire::Body body) const {
    wire::Message m;
    m.session = session;
    m.round = round;
    m.body = std::move(body);
    return m;
  }

  // A peer that gave up sends ERROR and closes; our next send may then fail with EPIPE
  // before we read the ERROR. Prefer the peer's own reason when it is waiting.
  Status explain_send_failure(Peer& p, Status failed) {
    auto got = p.channel.receive(std::chrono::milliseconds(0));
    if (got.ok()) {
      auto m = wire::decode(got->bytes, p.channel.peer());
      if (m.ok() && m->type() == wire::MessageType::kError) {
        const auto& e = std::get<wire::Error>(m->body);
        return Status(
            e.code, fmt::format("{} gave up on round {}: {}", p.channel.peer(), round, e.message));
      }
    }
    return Status(failed.code(), fmt::format("round {}: {}", round, failed.message()));
  }

  Status send_all(const wire::Message& m) {
    const std::vector<std::byte> bytes = wire::encode(m);
    for (Peer& p : peers) {
      Status s = p.channel.send(bytes, options.timeout);
      if (!s.ok()) return explain_send_failure(p, s);
      p.conversation.sent(m);
    }
    return ok_status();
  }

  // Tells every peer the session is over (best effort) and remembers why.
  Status fail(Status why) {
    if (broken.ok()) broken = why;
    const auto bytes = wire::encode(message(wire::Error{why.code(), why.message()}));
    for (Peer& p : peers) {
      if (p.channel.valid()) (void)p.channel.send(bytes, std::chrono::milliseconds(100));
      p.channel.close();
    }
    return why;
  }

  // Handles one message from `p`.
  Status handle(Peer& p, const wire::Message& m, std::uint64_t round_checksum) {
    Status s = p.conversation.received(m);
    if (!s.ok()) return s;
    switch (m.type()) {
      case wire::MessageType::kRelease:
        ++p.released;
        return ok_status();
      case wire::MessageType::kAck: {
        const auto& a = std::get<wire::Ack>(m.body);
        if (a.round_checksum != round_checksum) {
          return corruption(
              fmt::format("{} acknowledged round {} with checksum {:016x}, the "
                          "sender's is {:016x}",
                          p.channel.peer(), round, a.round_checksum, round_checksum));
        }
        p.acked = true;
        return ok_status();
      }
      case wire::MessageType::kError: {
        const auto& e = std::get<wire::Error>(m.body);
        return Status(
            e.code, fmt::format("{} gave up on round {}: {}", p.channel.peer(), round, e.message));
      }
      default:
        return internal_error("unexpected message passed the conversation check");
    }
  }

  // Reads messages until done() holds, failing if no peer says anything for a whole timeout.
  Status wait_until(const std::function<bool(const Peer&)>& peer_done, std::uint64_t round_checksum,
                    const char* waiting_for) {
    auto done = [&] {
      for (const Peer& p : peers) {
        if (!peer_done(p)) return false;
      }
      return true;
    };
    std::vector<pollfd> fds(peers.size());
    auto deadline = Clock::now() + options.timeout;
    while (!done()) {
      // Only peers still owing something: one that acknowledged and exited is not a failure.
      for (std::size_t i = 0; i < peers.size(); ++i) {
        fds[i] = {peer_done(peers[i]) ? -1 : peers[i].channel.fd(), POLLIN, 0};
      }
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
      const int r = ::poll(fds.data(), fds.size(), left < 0 ? 0 : static_cast<int>(left));
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) return errno_status("poll", "receivers", errno);
      if (r == 0) {
        std::string slow;
        for (const Peer& p : peers) {
          if (!peer_done(p)) slow += (slow.empty() ? "" : ", ") + p.channel.peer();
        }
        return timeout_error(
            fmt::format("round {}: no word from the receivers ({}) for {} ms "
                        "while waiting for {}",
                        round, slow, options.timeout.count(), waiting_for));
      }
      for (std::size_t i = 0; i < peers.size(); ++i) {
        if (fds[i].revents == 0) continue;
        Peer& p = peers[i];
        auto got = p.channel.receive(options.timeout);
        if (!got.ok()) {
          return Status(got.status().code(),
                        fmt::format("round {}: {}", round, got.status().message()));
        }
        auto m = wire::decode(got->bytes, p.channel.peer());
        if (!m.ok()) return m.status();
        Status s = handle(p, *m, round_checksum);
        if (!s.ok()) return s;
      }
      deadline = Clock::now() + options.timeout;  // progress: the timeout is per silence
    }
    return ok_status();
  }

  Status accept_one() {
    const auto deadline = Clock::now() + options.timeout;
    while (true) {
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      if (left.count() <= 0) {
        return timeout_error(fmt::format("no receiver joined {} within {} ms", listener.address(),
                                         options.timeout.count()));
      }
      auto ch = listener.accept(left);
      if (!ch.ok()) return ch.status();
      Peer p{std::move(*ch), wire::Conversation(wire::Conversation::Role::kSender, "", session)};
      auto got = p.channel.receive(options.timeout);
      if (!got.ok()) {
        continue;  // a peer that connects and leaves is not a reason to stop serving
      }
      auto m = wire::decode(got->bytes, p.channel.peer());
      Status s = m.ok() ? p.conversation.received(*m) : m.status();
      std::uint32_t id = 0;
      if (s.ok()) {
        const auto& h = std::get<wire::Hello>(m->body);
        id = h.receiver_id;
        p.channel.set_peer(fmt::format("receiver {} (pid {})", id, h.pid));
        for (const Peer& q : peers) {
          if (q.id == id) s = already_exists(fmt::format("receiver id {} already joined", id));
        }
      }
      if (!s.ok()) {
        // Turned away, not consumed: it hears why and the session goes on.
        (void)p.channel.send(wire::encode(message(wire::Error{s.code(), s.message()})),
                             std::chrono::milliseconds(100));
        continue;
      }
      p.id = id;
      p.conversation =
          wire::Conversation(wire::Conversation::Role::kSender, p.channel.peer(), session);
      (void)p.conversation.received(*m);
      const wire::Message welcome = message(wire::Welcome{
          ring.slots(), ring.slot_bytes(), static_cast<std::uint8_t>(options.checksums ? 1 : 0)});
      s = p.channel.send(wire::encode(welcome), options.timeout, ring.fd());
      if (!s.ok()) {
        continue;
      }
      p.conversation.sent(welcome);
      peers.push_back(std::move(p));
      return ok_status();
    }
  }

  // Packs bucket b into its slot and publishes it segment by segment (sync/segment.h).
  template <class Source>
  Status send_bucket(std::uint32_t b, const Source& weights, RoundChecksum& round_sum) {
    const std::uint32_t slot_index = b % ring.slots();
    std::byte* slot = ring.slot(slot_index);
    const std::uint64_t used = plan.bucket_used[b];
    SegmentWalker walker(plan.bucket(b));
    std::uint64_t begin = 0;
    while (true) {
      const std::uint64_t end = std::min(used, begin + kSegmentBytes);
      const bool last = end == used;
      std::uint64_t sum = 0;
      {
        profiler::Span span("sync.pack", profiler::Detail::kBucket);
        BucketHash hash(slot, begin);
        walker.walk(
            begin, end, last,
            [&](const Piece& p, std::uint64_t at, std::uint64_t n) {
              std::uint64_t bucket_offset = p.bucket_offset + at;
              weights.for_each_run(p.tensor, p.tensor_offset + at, n,
                                   [&](const std::byte* src, std::uint64_t len) {
                                     if (options.checksums) {
                                       hash.copy_piece(slot + bucket_offset, src, len,
                                                       bucket_offset);
                                     } else {
                                       copy_bytes(slot + bucket_offset, src, len);
                                     }
                                     bucket_offset += len;
                                   });
            },
            [](const Piece&) {});
        if (options.checksums) sum = hash.finish(end);
      }
      round_sum.add_bucket(b, end, sum);
      if (corrupt_hook && begin == 0) corrupt_hook(b, slot);
      profiler::Span span("sync.publish", profiler::Detail::kBucket);
      Status s = send_all(message(wire::Filled{slot_index, b, end, sum, begin,
                                               static_cast<std::uint8_t>(last)}));
      if (!s.ok() || last) return s;
      begin = end;
    }
  }

  template <class Source>
  Result<RoundStats> send_round(const Source& weights) {
    profiler::Span round_span("sync.send_round");
    const auto start = Clock::now();
    std::vector<TensorSpec> specs;
    specs.reserve(weights.size());
    std::unordered_set<std::string_view> names;
    names.reserve(weights.size());
    for (std::size_t i = 0; i < weights.size(); ++i) {
      const TensorSpec& spec = weights.spec(i);
      if (weights.bytes_given(i) != spec.bytes()) {
        return invalid_argument(fmt::format("tensor '{}': {} bytes given, {} needs {}", spec.name,
                                            weights.bytes_given(i), spec.to_string(),
                                            spec.bytes()));
      }
      if (!names.insert(spec.name).second) {
        return invalid_argument(fmt::format("tensor '{}' appears twice in the round", spec.name));
      }
      specs.push_back(spec);
    }
    // The plan is deterministic from the manifest: reuse it while the manifest is unchanged.
    if (specs != manifest || plan.bucket_bytes == 0) {
      auto p = plan_buckets(specs, options.bucket_bytes);
      if (!p.ok()) return p.status();
      plan = std::move(*p);
      manifest = specs;
    }
    ++round;
    for (Peer& p : peers) {
      p.released = 0;
      p.acked = false;
    }
    wire::Begin begin{options.bucket_bytes, plan.total_bytes, plan.bucket_count(),
                      std::move(specs)};
    const wire::Message begin_message = message(std::move(begin));
    const std::vector<std::byte> begin_bytes = wire::encode(begin_message);
    RoundChecksum round_sum(begin_bytes);
    for (Peer& p : peers) {
      Status s = p.channel.send(begin_bytes, options.timeout);
      if (!s.ok()) return fail(explain_send_failure(p, s));
      p.conversation.sent(begin_message);
    }
    const std::uint32_t k = ring.slots();
    for (std::uint32_t b = 0; b < plan.bucket_count(); ++b) {
      if (b >= k) {
        // Slot b % k still holds bucket b - k until every receiver released it.
        const std::uint32_t need = b - k + 1;
        profiler::Span span("sync.wait_slot", profiler::Detail::kBucket);
        Status s = wait_until([&](const Peer& p) { return p.released >= need; }, 0, "a free slot");
        if (!s.ok()) return fail(s);
      }
      Status s = send_bucket(b, weights, round_sum);
      if (!s.ok()) return fail(s);
    }
    const std::uint64_t digest = round_sum.digest();
    Status s = send_all(message(wire::End{plan.bucket_count(), digest}));
    if (!s.ok()) return fail(s);
    {
      profiler::Span span("sync.wait_ack");
      s = wait_until([](const Peer& p) { return p.acked; }, digest, "acknowledgements");
    }
    if (!s.ok()) return fail(s);
    RoundStats stats = finished_round(round, weights.size(), plan, start, digest);
    return stats;
  }
};

Sender::Sender(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Sender::~Sender() = default;

Result<std::unique_ptr<Sender>> Sender::create(const std::string& address,
                                               const SyncOptions& options) {
  Status s = validate_options(options);
  if (!s.ok()) return s;
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  impl->session = random_session();
  auto listener = shm::Listener::bind(address);
  if (!listener.ok()) return listener.status();
  impl->listener = std::move(*listener);
  auto ring = shm::MemfdRing::create(options.slots, options.bucket_bytes);
  if (!ring.ok()) return ring.status();
  impl->ring = std::move(*ring);
  return std::unique_ptr<Sender>(new Sender(std::move(impl)));
}

Status Sender::accept(std::uint32_t receivers) {
  if (!impl_->broken.ok()) return impl_->broken;
  for (std::uint32_t i = 0; i < receivers; ++i) {
    Status s = impl_->accept_one();
    if (!s.ok()) return s;
  }
  return ok_status();
}

Result<RoundStats> Sender::send_round(std::span<const TensorView> weights) {
  if (!impl_->broken.ok()) {
    return failed_precondition("the session failed earlier: " + impl_->broken.to_string());
  }
  if (impl_->peers.empty()) return failed_precondition("send_round: no receiver has joined");
  return impl_->send_round(ViewSource{weights});
}

Result<RoundStats> Sender::send_round_gathered(std::span<const GatheredTensor> weights) {
  if (!impl_->broken.ok()) {
    return failed_precondition("the session failed earlier: " + impl_->broken.to_string());
  }
  if (impl_->peers.empty()) return failed_precondition("send_round: no receiver has joined");
  return impl_->send_round(GatheredSource(weights));
}

std::uint64_t Sender::session_id() const { return impl_->session; }
std::uint64_t Sender::rounds_sent() const { return impl_->round; }
std::uint32_t Sender::receivers() const { return static_cast<std::uint32_t>(impl_->peers.size()); }
const std::string& Sender::address() const { return impl_->listener.address(); }
void Sender::set_corrupt_hook_for_testing(std::function<void(std::uint32_t, std::byte*)> hook) {
  impl_->corrupt_hook = std::move(hook);
}

}  // namespace ferry::sync
