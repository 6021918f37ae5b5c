#include "ferry/multi_receiver.h"

#include <fmt/format.h>
#include <xxhash.h>

#include <atomic>
#include <functional>
#include <thread>
#include <unordered_set>

#include "base/clock.h"
#include "base/coding.h"
#include "base/mutex.h"
#include "base/thread_annotations.h"
#include "sync/round_agreement.h"

namespace ferry::sync {
namespace {

// The first failure of a round, which stops the other senders' rounds: each Receiver's
// SyncOptions::interrupt asks it about every 100 ms while it waits.
class RoundStop {
 public:
  explicit RoundStop(std::function<Status()> user_interrupt)
      : user_interrupt_(std::move(user_interrupt)) {}

  void start_round() {
    MutexLock lock(mu_);
    first_error_ = ok_status();
    stopping_ = false;
  }

  // Keeps the round's first error; the others' are only the stop it caused.
  void failed(const std::string& sender, const Status& why) {
    MutexLock lock(mu_);
    if (!stopping_) {
      first_error_ = why.with_context(sender);
      failed_sender_ = sender;
      stopping_ = true;
    }
  }

  Status first_error() {
    MutexLock lock(mu_);
    return first_error_;
  }

  // The Receivers' interrupt hook.
  Status interrupt() {
    {
      MutexLock lock(mu_);
      if (stopping_) return aborted(fmt::format("{} failed the round", failed_sender_));
    }
    if (!user_interrupt_) return ok_status();
    MutexLock lock(user_mu_);  // the user's hook is called one call at a time
    return user_interrupt_();
  }

 private:
  Mutex mu_;
  Status first_error_ FERRY_GUARDED_BY(mu_);
  std::string failed_sender_ FERRY_GUARDED_BY(mu_);
  bool stopping_ FERRY_GUARDED_BY(mu_) = false;
  Mutex user_mu_;
  const std::function<Status()> user_interrupt_;
};

}  // namespace

struct MultiReceiver::Impl {
  std::vector<std::string> addresses;
  std::vector<std::string> names;  // "sender 1 (@job42-rank1)", as errors name them
  // Declared before the receivers, whose hooks point at them.
  RoundAgreement agreement;
  RoundStop stop;
  std::vector<std::unique_ptr<Receiver>> receivers;  // one per address; empty once broken
  std::vector<RoundStats> stats;
  Status broken;

  Impl(std::vector<std::string> addrs, std::vector<std::string> sender_names,
       std::function<Status()> user_interrupt)
      : addresses(std::move(addrs)),
        names(sender_names),
        agreement(std::move(sender_names)),
        stop(std::move(user_interrupt)) {}

  // Receives one round from every sender with `receive_one`, each on a thread of its own
  // (the caller's for the first).
  Result<RoundStats> run(const std::function<Result<RoundStats>(Receiver&)>& receive_one) {
    if (!broken.ok()) {
      return failed_precondition("the session failed earlier: " + broken.to_string());
    }
    const auto start = Clock::now();
    agreement.start_round();
    stop.start_round();
    std::vector<RoundStats> got(receivers.size());
    auto one = [&](std::size_t i) {
      auto r = receive_one(*receivers[i]);
      if (r.ok()) {
        got[i] = *r;
      } else {
        stop.failed(names[i], r.status());
      }
    };
    std::vector<std::thread> threads;
    for (std::size_t i = 1; i < receivers.size(); ++i) threads.emplace_back(one, i);
    one(0);
    for (std::thread& t : threads) t.join();
    if (Status failed = stop.first_error(); !failed.ok()) {
      // Every session ends: a sender whose round went through sees its receiver gone.
      broken = failed;
      receivers.clear();
      return failed;
    }
    stats = std::move(got);
    return combined(start);
  }

  RoundStats combined(Clock::time_point start) const {
    RoundStats all;
    all.round = stats[0].round;
    all.version = stats[0].version;
    all.base_version = stats[0].base_version;
    all.more_follows = stats[0].more_follows;
    all.step = stats[0].step;  // the senders agreed on it (RoundAgreement)
    std::vector<std::byte> checksums;
    for (const RoundStats& s : stats) {
      all.tensors += s.tensors;
      all.buckets += s.buckets;
      all.bytes += s.bytes;
      all.wire_bytes += s.wire_bytes;
      all.delta = all.delta || s.delta;
      coding::put_u64(&checksums, s.checksum);
    }
    all.checksum = XXH3_64bits(checksums.data(), checksums.size());
    all.seconds = std::chrono::duration<double>(Clock::now() - start).count();
    return all;
  }
};

MultiReceiver::MultiReceiver(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
MultiReceiver::~MultiReceiver() = default;

Result<std::unique_ptr<MultiReceiver>> MultiReceiver::connect(
    const std::vector<std::string>& addresses, std::uint32_t receiver_id,
    const SyncOptions& options) {
  if (addresses.empty()) return invalid_argument("MultiReceiver: give at least one address");
  std::unordered_set<std::string> seen;
  std::vector<std::string> names;
  for (std::size_t i = 0; i < addresses.size(); ++i) {
    if (!seen.insert(addresses[i]).second) {
      return invalid_argument(fmt::format(
          "MultiReceiver: address '{}' is given twice; each sender has its own", addresses[i]));
    }
    names.push_back(fmt::format("sender {} ({})", i, addresses[i]));
  }
  auto impl = std::make_unique<Impl>(addresses, names, options.interrupt);
  Impl* shared = impl.get();  // the hooks' target, which outlives the receivers
  SyncOptions each = options;
  each.interrupt = [shared] { return shared->stop.interrupt(); };
  for (std::size_t i = 0; i < addresses.size(); ++i) {
    auto r = Receiver::connect(addresses[i], receiver_id, each);
    if (!r.ok()) return r.status().with_context(names[i]);
    (*r)->set_begin_check(
        [shared, i](const RoundBegin& b) { return shared->agreement.check(i, b); });
    impl->receivers.push_back(std::move(*r));
  }
  return std::unique_ptr<MultiReceiver>(new MultiReceiver(std::move(impl)));
}

Status MultiReceiver::set_destination(MutableTensorView destination) {
  if (!impl_->broken.ok()) {
    return failed_precondition("the session failed earlier: " + impl_->broken.to_string());
  }
  // Every sender's Receiver knows every destination: which sender sends a tensor is only
  // known from its BEGIN.
  for (auto& r : impl_->receivers) {
    if (Status s = r->set_destination(destination); !s.ok()) return s;
  }
  return ok_status();
}

void MultiReceiver::clear_destinations() {
  for (auto& r : impl_->receivers) r->clear_destinations();
}

Result<RoundStats> MultiReceiver::receive_round_into() {
  return impl_->run([](Receiver& r) { return r.receive_round_into(); });
}

Result<RoundStats> MultiReceiver::receive_round(const TensorCallback& on_tensor) {
  Mutex one_at_a_time;
  const TensorCallback serialised = [&](const TensorView& t) {
    MutexLock lock(one_at_a_time);
    return on_tensor(t);
  };
  return impl_->run([&](Receiver& r) { return r.receive_round(serialised); });
}

std::span<const RoundStats> MultiReceiver::sender_stats() const { return impl_->stats; }
const std::vector<std::string>& MultiReceiver::addresses() const { return impl_->addresses; }

}  // namespace ferry::sync
