// The rules the rounds of a MultiReceiver's senders follow together (ferry/multi_receiver.h),
// checked as each sender's BEGIN arrives, before any of its tensors is delivered.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "base/mutex.h"
#include "base/thread_annotations.h"
#include "ferry/sync.h"

namespace ferry::sync {

class RoundAgreement {
 public:
  // `senders`: how errors name each sender ("sender 1 (@job42-rank1)").
  explicit RoundAgreement(std::vector<std::string> senders) : senders_(std::move(senders)) {}

  // Forgets the last round's BEGINs: called before every round.
  void start_round();

  // Sender `sender`'s BEGIN: the same more_follows and step as the round's first BEGIN
  // (kFailedPrecondition otherwise), and no tensor another sender sends (kInvalidArgument
  // naming the tensor and both senders). Round numbers are not compared: they differ after a
  // recovery (ferry/multi_receiver.h says why). Called from the senders' threads.
  Status check(std::size_t sender, const RoundBegin& begin);

 private:
  const std::vector<std::string> senders_;
  Mutex mu_;
  // The first BEGIN of this round, which the others must agree with.
  std::optional<std::size_t> first_sender_ FERRY_GUARDED_BY(mu_);
  std::uint64_t first_round_ FERRY_GUARDED_BY(mu_) = 0;  // its round number, for messages
  bool first_more_follows_ FERRY_GUARDED_BY(mu_) = false;
  std::optional<std::uint64_t> first_step_ FERRY_GUARDED_BY(mu_);
  // Which sender sends each tensor of this round.
  std::unordered_map<std::string, std::size_t> owner_ FERRY_GUARDED_BY(mu_);
};

}  // namespace ferry::sync
