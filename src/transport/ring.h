// The session's memory: K slots of one bucket each, which a sender fills and its peers read.
// A Transport allocates it (Transport::allocate_ring) or maps the one a peer passed
// (map_peer_ring). Today every transport's ring is a memfd (shm/memfd_ring.h): shm peers map
// the sender's, net peers have segments sent from and into their own once it is registered
// (Channel::register_memory). A transport whose ring lives elsewhere (device memory,
// registered RDMA memory) implements this interface; callers see only the slots.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <utility>

#include "ferry/status.h"

namespace ferry::transport {

// A writable view of a ring that this end may only read, private to this process: writes
// into a slot change what this process sees alone (the ring, the sender and every other
// reader keep the original bytes). Receivers hand their callers tensors in it when the
// caller asked to write into them (verl's receive contract).
class WritableView {
 public:
  virtual ~WritableView() = default;
  // REQUIRES: i < the ring's slots. Writable; shows the ring's bytes until written.
  virtual std::byte* slot(std::uint32_t i) const = 0;
  // Drops what this process wrote into slot i, which shows the ring's bytes again.
  // REQUIRES: no view of slot i is in use. Calls for different slots may run at once.
  virtual Status forget_writes(std::uint32_t i) = 0;
  // Slot i read-only (its lease ended: a late write faults instead of changing what later
  // rounds show), or writable again (new views are handed out).
  virtual Status seal(std::uint32_t i) = 0;
  virtual Status unseal(std::uint32_t i) = 0;
};

class Ring {
 public:
  virtual ~Ring() = default;

  std::uint32_t slots() const { return slots_; }
  std::uint64_t slot_bytes() const { return slot_bytes_; }
  // REQUIRES: i < slots(). Writable only on the end that allocated the ring.
  std::byte* slot(std::uint32_t i) const { return base_ + i * slot_bytes_; }
  // Every slot, in order (what Channel::register_memory registers).
  std::span<std::byte> memory() const { return {base_, std::size_t{slots_} * slot_bytes_}; }

  // The descriptor a peer that shares memory maps (Channel::send_with_fd passes it, the
  // peer's Transport::map_peer_ring maps it read-only); -1 when the ring cannot be shared.
  virtual int share_fd() const { return -1; }
  // A WritableView of this ring; kUnimplemented where the transport has none. Each call
  // maps a new one.
  virtual Result<std::unique_ptr<WritableView>> writable_view() const {
    return unimplemented("this ring has no writable view");
  }

 protected:
  Ring() = default;
  Ring(Ring&& o) noexcept { *this = std::move(o); }
  Ring& operator=(Ring&& o) noexcept {
    base_ = std::exchange(o.base_, nullptr);
    slots_ = std::exchange(o.slots_, 0);
    slot_bytes_ = std::exchange(o.slot_bytes_, 0);
    return *this;
  }
  // The implementation says where its slots are (after mapping them, and again after a move).
  void set_slots(std::byte* base, std::uint32_t slots, std::uint64_t slot_bytes) {
    base_ = base;
    slots_ = slots;
    slot_bytes_ = slot_bytes;
  }

 private:
  std::byte* base_ = nullptr;
  std::uint32_t slots_ = 0;
  std::uint64_t slot_bytes_ = 0;
};

}  // namespace ferry::transport
