#include "tensor_feed.h"

#include <fmt/format.h>

#include <cstdint>
#include <memory>

namespace ferry::python {

Status TensorFeed::offer(std::span<const std::byte> bytes) {
  std::lock_guard lock(mutex_);
  if (has_offer_ || held_) {
    return failed_precondition("TensorFeed.offer: the last tensor was not taken yet");
  }
  if (ended_ || !failure_.empty()) {
    return failed_precondition("TensorFeed.offer: the stream already ended");
  }
  offered_ = bytes;
  has_offer_ = true;
  changed_.notify_all();
  return ok_status();
}

bool TensorFeed::wait_taken(std::chrono::milliseconds timeout) {
  std::unique_lock lock(mutex_);
  const auto done = [this] { return stopped_ || (!has_offer_ && !held_); };
  if (timeout.count() < 0) {
    changed_.wait(lock, done);
    return true;
  }
  return changed_.wait_for(lock, timeout, done);
}

void TensorFeed::end() {
  std::lock_guard lock(mutex_);
  ended_ = true;
  changed_.notify_all();
}

void TensorFeed::fail(std::string why) {
  std::lock_guard lock(mutex_);
  failure_ = why.empty() ? "the stream failed" : std::move(why);
  changed_.notify_all();
}

bool TensorFeed::stopped() const {
  std::lock_guard lock(mutex_);
  return stopped_;
}

Result<std::span<const std::byte>> TensorFeed::take() {
  std::unique_lock lock(mutex_);
  held_ = false;  // the sender asks for the next tensor: it is done with the last one
  changed_.notify_all();
  changed_.wait(lock, [this] { return has_offer_ || ended_ || !failure_.empty(); });
  if (has_offer_) {
    has_offer_ = false;
    held_ = true;
    return offered_;
  }
  if (!failure_.empty()) return aborted(failure_);
  return std::span<const std::byte>();
}

void TensorFeed::stop() {
  std::lock_guard lock(mutex_);
  stopped_ = true;
  has_offer_ = false;
  held_ = false;
  changed_.notify_all();
}

// -- Python ---------------------------------------------------------------------------------

void bind_tensor_feed(py::module_& m) {
  py::class_<TensorFeed, std::shared_ptr<TensorFeed>>(
      m, "TensorFeed",
      "Hands a streamed round's tensors from the pulling thread to the sender's thread: pass "
      "it as send_round_streamed's `next` (use ferry.Sender.send_round_streamed_async).")
      .def(py::init<>(), "A feed with nothing offered yet; one per round.")
      .def(
          "offer",
          [](TensorFeed& f, std::uintptr_t address, std::size_t nbytes) {
            check(f.offer({reinterpret_cast<const std::byte*>(address), nbytes}));
          },
          py::arg("address"), py::arg("nbytes"),
          "Offers the next tensor's bytes, valid until wait_taken() returns True.")
      .def(
          "wait_taken",
          [](TensorFeed& f, double timeout_s) {
            py::gil_scoped_release nogil;
            return f.wait_taken(std::chrono::milliseconds(
                timeout_s < 0 ? -1 : static_cast<std::int64_t>(timeout_s * 1000.0)));
          },
          py::arg("timeout") = -1.0,
          "Waits up to `timeout` seconds (negative: no limit) until the sender is done with the "
          "offered bytes; True once it is.")
      .def("end", &TensorFeed::end, "The stream is over.")
      .def("fail", &TensorFeed::fail, py::arg("why"),
           "The stream failed: the sender aborts the round with `why`.")
      .def_property_readonly("stopped", &TensorFeed::stopped,
                             "True once the sender stopped asking (its round ended or failed).");
}

}  // namespace ferry::python
