#include "ferry/multi_receiver.h"

#include <fmt/format.h>
#include <xxhash.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <optional>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "base/clock.h"
#include "base/coding.h"
#include "base/mutex.h"
#include "base/status_macros.h"
#include "base/thread_annotations.h"
#include "sync/round_agreement.h"
#include "sync/round_reader.h"

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

// receive_update's rules across the senders' rounds of one update (multi_receiver.h): one
// step for every round, and each tensor from one sender only. more_follows is not compared:
// each sender splits its part into rounds of its own. It is also the barrier before the last
// rounds' ACKs: a sender's update succeeds once its last round is acknowledged, so without it
// a sender whose part arrived first would succeed while another dies, and only the receivers
// would know the update failed.
class UpdateAgreement {
 public:
  explicit UpdateAgreement(std::vector<std::string> senders) : senders_(std::move(senders)) {}

  void start_update() {
    MutexLock lock(mu_);
    first_sender_.reset();
    owner_.clear();
    last_ended_ = 0;
  }

  // Called at a sender's last round's verified END, before its ACK: waits until every
  // sender's last round got there, or `interrupt` (the update's stop) says to give up.
  Status wait_for_every_last_end(const std::function<Status()>& interrupt) {
    {
      MutexLock lock(mu_);
      ++last_ended_;
      all_ended_.notify_all();
    }
    while (true) {
      {
        MutexLock lock(mu_);
        if (last_ended_ == senders_.size()) return ok_status();
        all_ended_.wait_for(mu_, std::chrono::milliseconds(100));
        if (last_ended_ == senders_.size()) return ok_status();
      }
      if (Status s = interrupt(); !s.ok()) return s;
    }
  }

  Status check(std::size_t sender, const RoundBegin& begin) {
    MutexLock lock(mu_);
    if (!first_sender_) {
      first_sender_ = sender;
      first_step_ = begin.step;
    } else if (begin.step != first_step_) {
      const auto step = [](std::optional<std::uint64_t> v) {
        return v ? fmt::format("step {}", *v) : std::string("no step");
      };
      return failed_precondition(fmt::format(
          "{} sends {}, {} (its round {}) sends {}: every round of one update must carry the "
          "same step",
          senders_[*first_sender_], step(first_step_), senders_[sender], begin.round,
          step(begin.step)));
    }
    for (const TensorSpec& t : begin.tensors) {
      const auto [it, added] = owner_.try_emplace(t.name, sender);
      if (!added && it->second != sender) {
        return invalid_argument(fmt::format(
            "tensor '{}' is sent by both {} and {}: the senders' parts must be disjoint", t.name,
            senders_[it->second], senders_[sender]));
      }
    }
    return ok_status();
  }

 private:
  const std::vector<std::string> senders_;
  Mutex mu_;
  std::optional<std::size_t> first_sender_ FERRY_GUARDED_BY(mu_);
  std::optional<std::uint64_t> first_step_ FERRY_GUARDED_BY(mu_);
  std::unordered_map<std::string, std::size_t> owner_ FERRY_GUARDED_BY(mu_);
  std::size_t last_ended_ FERRY_GUARDED_BY(mu_) = 0;  // senders at their last round's END
  CondVar all_ended_;
};

// `more` (a sender's next round of one update) added to `sum`.
void add_round(RoundStats* sum, const RoundStats& more) {
  const std::uint64_t previous = sum->checksum;
  const RoundStats before = *sum;
  *sum = more;
  sum->tensors += before.tensors;
  sum->buckets += before.buckets;
  sum->bytes += before.bytes;
  sum->delivered_bytes += before.delivered_bytes;
  sum->wire_bytes += before.wire_bytes;
  sum->seconds += before.seconds;
  sum->delta = sum->delta || before.delta;
  const std::uint64_t pair[2] = {previous, more.checksum};
  sum->checksum = XXH3_64bits(pair, sizeof(pair));
  sum->more_follows = false;
}

}  // namespace

struct MultiReceiver::Impl {
  std::vector<std::string> addresses;
  std::vector<std::string> names;  // "sender 1 (@job42-rank1)", as errors name them
  // Declared before the receivers, whose hooks point at them.
  RoundAgreement agreement;
  UpdateAgreement update_agreement;
  bool whole_updates = false;  // receive_update's rules apply, not receive_round's
  RoundStop stop;
  std::vector<std::unique_ptr<Receiver>> receivers;  // one per address; empty once broken
  std::vector<RoundStats> stats;
  Status broken;

  Impl(std::vector<std::string> addrs, std::vector<std::string> sender_names,
       std::function<Status()> user_interrupt)
      : addresses(std::move(addrs)),
        names(sender_names),
        agreement(sender_names),
        update_agreement(std::move(sender_names)),
        stop(std::move(user_interrupt)) {}

  Status check_begin(std::size_t sender, const RoundBegin& begin) {
    return whole_updates ? update_agreement.check(sender, begin) : agreement.check(sender, begin);
  }

  // At each round's verified END, before its ACK: an update's last rounds wait for each other.
  Status check_end(const RoundEnd& end) {
    if (!whole_updates || end.more_follows) return ok_status();
    return update_agreement.wait_for_every_last_end([this] { return stop.interrupt(); });
  }

  // Receives one round from every sender with `receive_one`, each on a thread of its own
  // (the caller's for the first).
  // `update`: receive_update's rules (whole_updates).
  Result<RoundStats> run(const std::function<Result<RoundStats>(Receiver&)>& receive_one,
                         bool update = false) {
    if (!broken.ok()) {
      return failed_precondition("the session failed earlier: " + broken.to_string());
    }
    const auto start = Clock::now();
    whole_updates = update;
    agreement.start_round();
    update_agreement.start_update();
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
      all.delivered_bytes += s.delivered_bytes;
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
    (*r)->set_begin_check([shared, i](const RoundBegin& b) { return shared->check_begin(i, b); });
    reader_of(**r).set_end_check([shared](const RoundEnd& e) { return shared->check_end(e); });
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

Status MultiReceiver::set_destination(const TensorSlice& slice, std::span<std::byte> local) {
  if (!impl_->broken.ok()) {
    return failed_precondition("the session failed earlier: " + impl_->broken.to_string());
  }
  for (auto& r : impl_->receivers) {
    if (Status s = r->set_destination(slice, local); !s.ok()) return s;
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

Result<RoundStats> MultiReceiver::receive_update(const TensorCallback& on_tensor) {
  Mutex one_at_a_time;
  const TensorCallback serialised = [&](const TensorView& t) {
    MutexLock lock(one_at_a_time);
    return on_tensor(t);
  };
  return impl_->run(
      [&](Receiver& r) -> Result<RoundStats> {
        RoundStats sum;
        while (true) {
          FERRY_ASSIGN_OR_RETURN(RoundStats round, r.receive_round(serialised));
          const bool more = round.more_follows;
          add_round(&sum, round);
          if (!more) return sum;
        }
      },
      /*update=*/true);
}

void MultiReceiver::set_min_step(std::uint64_t step) {
  for (auto& r : impl_->receivers) r->set_min_step(step);
}

std::span<const RoundStats> MultiReceiver::sender_stats() const { return impl_->stats; }
const std::vector<std::string>& MultiReceiver::addresses() const { return impl_->addresses; }

}  // namespace ferry::sync
