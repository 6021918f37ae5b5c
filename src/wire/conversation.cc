#include "wire/conversation.h"

#include <fmt/format.h>

#include <utility>

namespace ferry::wire {

Conversation::Conversation(Role local, std::string peer, std::uint64_t session)
    : role_(local), peer_(std::move(peer)), session_(session) {}

Status Conversation::reject(const Message& m, const std::string& why) const {
  const Code code =
      m.session != session_ && session_ != 0 ? Code::kFailedPrecondition : Code::kCorruption;
  return Status(code, fmt::format("{} from {} rejected: {}", m.describe(), peer_, why));
}

void Conversation::sent(const Message& m) {
  switch (m.type()) {
    case MessageType::kHello:
      break;
    case MessageType::kWelcome: {
      const auto& w = std::get<Welcome>(m.body);
      joined_ = true;
      slots_ = w.slots;
      slot_bytes_ = w.slot_bytes;
      round_ = m.round;
      break;
    }
    case MessageType::kBegin:
      in_round_ = true;
      end_seen_ = false;
      round_ = m.round;
      bucket_count_ = std::get<Begin>(m.body).bucket_count;
      filled_ = 0;
      released_ = 0;
      break;
    case MessageType::kFilled:
      if (std::get<Filled>(m.body).last != 0) ++filled_;
      break;
    case MessageType::kEnd:
      end_seen_ = true;
      break;
    case MessageType::kRelease:  // a receiver's: its slot may be filled again
      ++released_;
      break;
    default:
      break;
  }
}

Status Conversation::received(const Message& m) {
  return role_ == Role::kSender ? received_by_sender(m) : received_by_receiver(m);
}

Status Conversation::received_by_sender(const Message& m) {
  if (m.type() == MessageType::kHello) {
    if (joined_) return reject(m, "HELLO after the peer already joined");
    if (m.session != 0 && m.session != session_) {
      return reject(m, fmt::format("stale session: this sender's session is {:016x}", session_));
    }
    return ok_status();
  }
  if (!joined_) return reject(m, "expected HELLO first");
  if (m.session != session_) {
    return reject(m, fmt::format("stale session: this sender's session is {:016x}", session_));
  }
  switch (m.type()) {
    case MessageType::kError:
      return ok_status();
    case MessageType::kRelease: {
      const auto& r = std::get<Release>(m.body);
      if (!in_round_ || m.round != round_) {
        return reject(m, in_round_ ? fmt::format("stale round: round {} is in progress", round_)
                                   : "no round is in progress");
      }
      if (r.bucket != released_ || r.bucket >= filled_) {
        return reject(m, fmt::format("RELEASE of bucket {} out of order: {} filled, {} released",
                                     r.bucket, filled_, released_));
      }
      if (r.slot != r.bucket % slots_) {
        return reject(m, fmt::format("bucket {} lives in slot {}, not slot {}", r.bucket,
                                     r.bucket % slots_, r.slot));
      }
      ++released_;
      return ok_status();
    }
    case MessageType::kAck: {
      const auto& a = std::get<Ack>(m.body);
      if (!in_round_ || m.round != round_) {
        return reject(m, in_round_ ? fmt::format("stale round: round {} is in progress", round_)
                                   : "no round is in progress");
      }
      if (!end_seen_ || released_ != bucket_count_ || a.bucket_count != bucket_count_) {
        return reject(m, fmt::format("ACK before the round ended: {} of {} buckets released",
                                     released_, bucket_count_));
      }
      in_round_ = false;
      return ok_status();
    }
    default:
      return reject(m, "a receiver does not send this message");
  }
}

Status Conversation::received_by_receiver(const Message& m) {
  if (m.type() == MessageType::kError) {
    if (session_ != 0 && m.session != 0 && m.session != session_) {
      return reject(m, fmt::format("stale session: this receiver joined {:016x}", session_));
    }
    return ok_status();
  }
  if (m.type() == MessageType::kWelcome) {
    if (joined_) return reject(m, "a second WELCOME");
    if (m.session == 0) return reject(m, "session id 0 is not valid");
    if (session_ != 0 && m.session != session_) {
      return reject(m, fmt::format("stale session: this receiver asked for {:016x}", session_));
    }
    const auto& w = std::get<Welcome>(m.body);
    session_ = m.session;
    joined_ = true;
    slots_ = w.slots;
    slot_bytes_ = w.slot_bytes;
    round_ = m.round;
    return ok_status();
  }
  if (!joined_) return reject(m, "expected WELCOME first");
  if (m.session != session_) {
    return reject(m, fmt::format("stale session: this receiver joined {:016x}", session_));
  }
  switch (m.type()) {
    case MessageType::kBegin: {
      const auto& b = std::get<Begin>(m.body);
      if (in_round_) return reject(m, fmt::format("round {} has not ended", round_));
      if (m.round <= round_) {
        return reject(m, fmt::format("stale round: round {} already happened", round_));
      }
      if (b.bucket_bytes > slot_bytes_) {
        return reject(m, fmt::format("bucket of {} bytes exceeds the slot of {}", b.bucket_bytes,
                                     slot_bytes_));
      }
      in_round_ = true;
      end_seen_ = false;
      round_ = m.round;
      bucket_count_ = b.bucket_count;
      filled_ = 0;
      filled_end_ = 0;
      released_ = 0;
      return ok_status();
    }
    case MessageType::kFilled: {
      const auto& f = std::get<Filled>(m.body);
      if (!in_round_ || m.round != round_) {
        return reject(m, in_round_ ? fmt::format("stale round: round {} is in progress", round_)
                                   : "no round is in progress");
      }
      if (f.bucket != filled_ || f.bucket >= bucket_count_) {
        return reject(m, fmt::format("bucket {} out of order: expected bucket {} of {}", f.bucket,
                                     filled_, bucket_count_));
      }
      if (f.slot != f.bucket % slots_) {
        return reject(m, fmt::format("bucket {} belongs in slot {}, not slot {}", f.bucket,
                                     f.bucket % slots_, f.slot));
      }
      if (f.used_bytes > slot_bytes_) {
        return reject(
            m, fmt::format("{} used bytes exceed the slot of {}", f.used_bytes, slot_bytes_));
      }
      // The slot's last bucket must be released first: this end (and, behind a relay, its
      // peers) may still be reading it, and on a link that does not share memory the
      // segment's bytes are written into it.
      if (f.bucket >= released_ + slots_) {
        return reject(m, fmt::format("bucket {} sent into slot {} while bucket {} still holds it",
                                     f.bucket, f.slot, f.bucket - slots_));
      }
      if (f.offset != filled_end_ || (f.last == 0 && f.used_bytes == f.offset)) {
        return reject(m, fmt::format("segment [{}, {}) of bucket {} out of order: expected one "
                                     "starting at {}",
                                     f.offset, f.used_bytes, f.bucket, filled_end_));
      }
      if (f.last != 0) {
        ++filled_;
        filled_end_ = 0;
      } else {
        filled_end_ = f.used_bytes;
      }
      return ok_status();
    }
    case MessageType::kEnd: {
      const auto& e = std::get<End>(m.body);
      if (!in_round_ || m.round != round_) {
        return reject(m, in_round_ ? fmt::format("stale round: round {} is in progress", round_)
                                   : "no round is in progress");
      }
      if (e.bucket_count != bucket_count_ || filled_ != bucket_count_) {
        return reject(m, fmt::format("END after {} of {} buckets (END says {})", filled_,
                                     bucket_count_, e.bucket_count));
      }
      in_round_ = false;
      end_seen_ = true;
      return ok_status();
    }
    default:
      return reject(m, "a sender does not send this message");
  }
}

}  // namespace ferry::wire
