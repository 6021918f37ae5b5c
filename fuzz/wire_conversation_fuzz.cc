// A stateful fuzzer for the wire Conversation: a sender-side and a receiver-side
// Conversation join one session and start round 1 the legitimate way, then the input is
// fed to them as a sequence of messages (wire_conversation_script.h). A message one side
// accepts is recorded as sent by the other, so accepted sequences drive both through
// rounds. Checked after every message, against a model kept here from accepted messages:
// - a refusal is a Status naming the peer, and leaves the state as it was;
// - FILLED is accepted only for the next bucket of the round in progress, in its slot,
//   within the slot, continuing the bucket's last segment, once the receiver released the
//   slot's last bucket;
// - END only when every bucket was filled, ACK only after END and every RELEASE,
//   RELEASE only of the next filled bucket;
// - a session never changes once joined, and a side accepts no message of its own kind.
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <variant>

#include "wire/conversation.h"
#include "wire/message.h"
#include "wire_conversation_script.h"

namespace ferry::wire {
namespace {

using fuzz::kSession;
using fuzz::kSlotBytes;
using fuzz::kSlots;

void check(bool ok) {
  if (!ok) __builtin_trap();
}

// What one side's Conversation should believe, from the messages it accepted or sent.
struct Model {
  std::uint64_t round = 1;
  bool in_round = true;
  std::uint32_t bucket_count = fuzz::kBuckets;
  std::uint32_t filled = 0;       // buckets completely filled this round
  std::uint64_t segment_end = 0;  // bytes of bucket `filled` announced so far
  std::uint32_t released = 0;
  bool end_seen = false;

  // The sender's side of a message that went out (or the receiver's of one it accepted).
  void apply_from_sender(const Message& m) {
    if (const auto* b = std::get_if<Begin>(&m.body)) {
      round = m.round;
      in_round = true;
      bucket_count = b->bucket_count;
      filled = 0;
      segment_end = 0;
      released = 0;
      end_seen = false;
    } else if (const auto* f = std::get_if<Filled>(&m.body)) {
      if (f->last != 0) {
        ++filled;
        segment_end = 0;
      } else {
        segment_end = f->used_bytes;
      }
    } else if (std::holds_alternative<End>(m.body)) {
      end_seen = true;
    }
  }
};

struct Snapshot {
  std::uint64_t session, round;
  bool in_round;
  std::uint32_t slots;
  std::uint64_t slot_bytes;
  explicit Snapshot(const Conversation& c)
      : session(c.session()),
        round(c.round()),
        in_round(c.in_round()),
        slots(c.slots()),
        slot_bytes(c.slot_bytes()) {}
  bool operator==(const Snapshot&) const = default;
};

// May the receiver's side accept `m` from the sender now, by the model?
bool receiver_may_accept(const Model& r, const Message& m) {
  if (std::holds_alternative<Error>(m.body)) return m.session == 0 || m.session == kSession;
  if (m.session != kSession) return false;
  if (const auto* b = std::get_if<Begin>(&m.body)) {
    return !r.in_round && m.round > r.round && b->bucket_bytes <= kSlotBytes;
  }
  if (!r.in_round || m.round != r.round) return false;
  if (const auto* f = std::get_if<Filled>(&m.body)) {
    return f->bucket == r.filled && f->bucket < r.bucket_count && f->slot == f->bucket % kSlots &&
           f->bucket < r.released + kSlots && f->used_bytes <= kSlotBytes &&
           f->offset == r.segment_end && (f->last != 0 || f->used_bytes > f->offset);
  }
  if (const auto* e = std::get_if<End>(&m.body)) {
    return r.filled == r.bucket_count && e->bucket_count == r.bucket_count;
  }
  return false;  // HELLO, WELCOME, RELEASE, ACK never come from a sender
}

// May the sender's side accept `m` from the receiver now, by the model?
bool sender_may_accept(const Model& s, const Message& m) {
  if (m.session != kSession) return false;
  if (std::holds_alternative<Error>(m.body)) return true;
  if (!s.in_round || m.round != s.round) return false;
  if (const auto* r = std::get_if<Release>(&m.body)) {
    return r->bucket == s.released && r->bucket < s.filled && r->slot == r->bucket % kSlots;
  }
  if (const auto* a = std::get_if<Ack>(&m.body)) {
    return s.end_seen && s.released == s.bucket_count && a->bucket_count == s.bucket_count;
  }
  return false;  // a second HELLO, or a sender's message
}

struct Session {
  Conversation sender{Conversation::Role::kSender, "receiver 0", kSession};
  Conversation receiver{Conversation::Role::kReceiver, "the sender", kSession};
  Model at_sender, at_receiver;

  Session() {
    const Message hello = fuzz::hello(), welcome = fuzz::welcome(),
                  begin = fuzz::begin(1, fuzz::kBuckets);
    check(sender.received(hello).ok());
    receiver.sent(hello);
    sender.sent(welcome);
    check(receiver.received(welcome).ok());
    sender.sent(begin);
    check(receiver.received(begin).ok());
    check(sender.in_round() && receiver.in_round() && receiver.round() == 1);
  }

  void to_receiver(const Message& m) {
    const Snapshot before(receiver);
    const bool allowed = receiver_may_accept(at_receiver, m);
    const Status s = receiver.received(m);
    if (!s.ok()) {
      check(!allowed);
      check(s.message().find("the sender") != std::string::npos);
      check(Snapshot(receiver) == before);
      return;
    }
    check(allowed);
    if (std::holds_alternative<Error>(m.body)) {
      check(Snapshot(receiver) == before);
      return;
    }
    at_receiver.apply_from_sender(m);
    if (std::holds_alternative<End>(m.body)) at_receiver.in_round = false;
    check(receiver.session() == kSession && receiver.round() == at_receiver.round &&
          receiver.in_round() == at_receiver.in_round);
    sender.sent(m);  // the receiver took it as the sender's; so the sender sent it
    at_sender.apply_from_sender(m);
  }

  void to_sender(const Message& m) {
    const Snapshot before(sender);
    const bool allowed = sender_may_accept(at_sender, m);
    const Status s = sender.received(m);
    if (!s.ok()) {
      check(!allowed);
      check(s.message().find("receiver 0") != std::string::npos);
      check(Snapshot(sender) == before);
      return;
    }
    check(allowed);
    if (std::holds_alternative<Release>(m.body)) {
      ++at_sender.released;
      ++at_receiver.released;  // the receiver sent it (below): its slot may be filled again
    }
    if (std::holds_alternative<Ack>(m.body)) at_sender.in_round = false;
    check(sender.session() == kSession && sender.round() == at_sender.round &&
          sender.in_round() == at_sender.in_round);
    receiver.sent(m);
  }
};

}  // namespace
}  // namespace ferry::wire

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  ferry::wire::Session session;
  std::span<const std::uint8_t> in(data, size);
  while (in.size() >= 3) {
    const std::uint8_t to = in[0];
    const std::size_t len =
        std::min<std::size_t>(in[1] | static_cast<std::size_t>(in[2]) << 8, in.size() - 3);
    const auto bytes = std::as_bytes(in.subspan(3, len));
    in = in.subspan(3 + len);
    auto m = ferry::wire::decode(bytes, to % 2 == 0 ? "the sender" : "receiver 0");
    if (!m.ok()) continue;
    if (to % 2 == 0) {
      session.to_receiver(*m);
    } else {
      session.to_sender(*m);
    }
  }
  return 0;
}
