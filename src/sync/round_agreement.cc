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
  } else if (begin.round != first_round_) {
    return failed_precondition(fmt::format(
        "{} began round {}, {} round {}: the senders are out of step (each counts its rounds "
        "from 1; restart them together)",
        senders_[sender], begin.round, senders_[*first_sender_], first_round_));
  } else if (begin.more_follows != first_more_follows_) {
    const std::size_t follows = begin.more_follows ? sender : *first_sender_;
    const std::size_t ends = begin.more_follows ? *first_sender_ : sender;
    return failed_precondition(fmt::format(
        "round {}: {} says more rounds of the update follow, {} says the update ends: the "
        "senders must split an update into the same rounds",
        begin.round, senders_[follows], senders_[ends]));
  }
  for (const TensorSpec& t : begin.tensors) {
    const auto [it, added] = owner_.try_emplace(t.name, sender);
    if (!added) {
      return invalid_argument(
          fmt::format("round {}: tensor '{}' is sent by both {} and {}: the senders' parts must "
                      "be disjoint",
                      begin.round, t.name, senders_[it->second], senders_[sender]));
    }
  }
  return ok_status();
}

}  // namespace ferry::sync
