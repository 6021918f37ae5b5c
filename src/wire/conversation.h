// The order of messages in a session, checked from one side of one connection.
//
// decode() checks that bytes form a message; Conversation checks that the
// message may come now: the right session, the round in progress, the next
// bucket. A stale or out-of-order message is an error naming the peer and the
// message, never consumed.
#pragma once

#include <cstdint>
#include <string>

#include "ferry/status.h"
#include "wire/message.h"

namespace ferry::wire {

class Conversation {
 public:
  enum class Role { kSender, kReceiver };  // the local side

  // `session` is the sender's id; a receiver passes the one it expects, or 0 for any.
  Conversation(Role local, std::string peer, std::uint64_t session);

  // Records a message this side sent; it changes what the peer may send next.
  void sent(const Message& m);
  // Checks a decoded message from the peer and, if it may come now, advances the state.
  Status received(const Message& m);

  const std::string& peer() const { return peer_; }
  std::uint64_t session() const { return session_; }
  std::uint64_t round() const { return round_; }
  bool in_round() const { return in_round_; }
  std::uint32_t slots() const { return slots_; }
  std::uint64_t slot_bytes() const { return slot_bytes_; }

 private:
  Status reject(const Message& m, const std::string& why) const;
  Status received_by_sender(const Message& m);
  Status received_by_receiver(const Message& m);

  Role role_;
  std::string peer_;
  std::uint64_t session_;
  bool joined_ = false;  // HELLO/WELCOME exchanged
  std::uint32_t slots_ = 0;
  std::uint64_t slot_bytes_ = 0;
  std::uint64_t round_ = 0;  // the round in progress, or the last one finished
  bool in_round_ = false;
  bool end_seen_ = false;  // END sent (sender) or received (receiver)
  std::uint32_t bucket_count_ = 0;
  std::uint32_t filled_ = 0;      // buckets completely filled so far this round
  std::uint64_t filled_end_ = 0;  // bytes of bucket filled_ announced so far
  std::uint32_t released_ = 0;    // RELEASE messages so far this round (sent or received)
};

}  // namespace ferry::wire
