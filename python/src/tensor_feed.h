// TensorFeed: hands a streamed round's tensors from the thread that pulls them to the
// sender's thread, which copies each into the ring (Sender::send_round_streamed).
//
// verl's weight generators must run on the event loop's thread (they may run collectives,
// and may refill one buffer per yield), while the sender runs in a worker thread. An asyncio
// round trip per tensor cost ~90 us (26 ms of a 290-tensor update); this is a condition
// variable each way, and the sender's side never takes the GIL.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <mutex>
#include <span>
#include <string>

#include "bindings.h"
#include "ferry/status.h"

namespace ferry::python {

class TensorFeed {
 public:
  // Puller: offers the next tensor's bytes, valid until wait_taken() returns true.
  // REQUIRES: the previous offer was taken (wait_taken() returned true).
  Status offer(std::span<const std::byte> bytes);
  // Puller: waits up to `timeout` (negative: no limit) until the sender is done with the
  // offered bytes: it asked for the next tensor or stopped. True once done.
  bool wait_taken(std::chrono::milliseconds timeout);
  // Puller: the stream is over; the sender's next request gets an empty span.
  void end();
  // Puller: the stream failed (the generator raised, a tensor differs from the manifest):
  // the sender's next request fails with `why`, which aborts the round.
  void fail(std::string why);
  // True once the sender stopped asking (its round ended or failed): pull no more.
  bool stopped() const;

  // Sender: the next tensor's bytes (waits for the offer; the previous tensor's bytes are
  // given back first), an empty span after end(), or the failure fail() gave.
  Result<std::span<const std::byte>> take();
  // Sender: the round is over, ok or not: wakes the puller for good.
  void stop();

 private:
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::span<const std::byte> offered_;
  bool has_offer_ = false;  // offered_ waits for the sender
  bool held_ = false;       // the sender holds the bytes it took last
  bool ended_ = false;
  bool stopped_ = false;
  std::string failure_;
};

void bind_tensor_feed(py::module_& m);

}  // namespace ferry::python
