#include "sync/round_agreement.h"

#include <fmt/format.h>

namespace ferry::sync {

void RoundAgreement::start_round() {
  MutexLock lock(mu_);
  first_sender_.reset();
  owner_.clear();
}

Status RoundAgreement::check(std::size_t sender, const RoundBegin& begin) {
  MutexLock lock(mu_);
  if (!first_sender_) {
    first_sender_ = sender;
    first_round_ = begin.round;
    first_more_follows_ = begin.more_follows;
    first_step_ = begin.step;
  } else if (begin.step != first_step_) {
    const auto step = [](std::optional<std::uint64_t> v) {
      return v ? fmt::format("step {}", *v) : std::string("no step");
    };
    return failed_precondition(fmt::format(
        "{} (its round {}) sends {}, {} (its round {}) sends {}: the senders of one update must "
        "carry the same step",
        senders_[*first_sender_], first_round_, step(first_step_), senders_[sender], begin.round,
        step(begin.step)));
  } else if (begin.more_follows != first_more_follows_) {
    const bool first_follows = first_more_follows_;
    return failed_precondition(fmt::format(
        "{} (its round {}) says more rounds of the update follow, {} (its round {}) says the "
        "update ends: the senders must split an update into the same rounds",
        senders_[first_follows ? *first_sender_ : sender],
        first_follows ? first_round_ : begin.round,
        senders_[first_follows ? sender : *first_sender_],
        first_follows ? begin.round : first_round_));
  }
  for (const TensorSpec& t : begin.tensors) {
    const auto [it, added] = owner_.try_emplace(t.name, sender);
    if (!added && it->second == sender) {
      return corruption(
          fmt::format("{} names tensor '{}' twice in one round", senders_[sender], t.name));
    }
    if (!added) {
      return invalid_argument(
          fmt::format("tensor '{}' is sent by both {} and {}: the senders' parts must be disjoint",
                      t.name, senders_[it->second], senders_[sender]));
    }
  }
  return ok_status();
}

}  // namespace ferry::sync
