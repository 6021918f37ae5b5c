#include "transport/net/message_channel.h"

#include <fmt/format.h>

#include "base/clock.h"

namespace ferry::net {
namespace {

Result<const MemoryRegion*> net_region(const transport::Region* region, const std::string& peer) {
  const auto* r = dynamic_cast<const RegisteredRegion*>(region);
  if (r == nullptr) {
    return invalid_argument("a segment for " + peer + " lies in memory not registered with net");
  }
  return &r->region();
}

}  // namespace

Result<std::unique_ptr<transport::Region>> register_region(Context& context,
                                                           std::span<std::byte> memory) {
  auto region = context.register_memory(memory);
  if (!region.ok()) return region.status();
  return std::unique_ptr<transport::Region>(std::make_unique<RegisteredRegion>(std::move(*region)));
}

MessageChannel::MessageChannel(net::Channel channel) : channel_(std::move(channel)) {
  if (!channel_.valid()) return;
  name_ = channel_.peer();
  address_ = name_.rfind("peer ", 0) == 0 ? name_.substr(5) : name_;
  transports_ = channel_.transports();
}

Result<std::size_t> MessageChannel::post(std::vector<std::byte> message) {
  Status s = channel_.send(message, std::chrono::milliseconds(0));
  if (!s.ok() && s.code() != Code::kTimeout) return s;
  return channel_.sends_in_flight();
}

std::unique_ptr<transport::Poller> MessageChannel::poller() const {
  if (!channel_.valid()) return transport::plain_poller();
  return std::make_unique<ProgressPoller>(channel_.context().shared_from_this());
}

Result<std::unique_ptr<transport::Region>> MessageChannel::register_memory(
    std::span<std::byte> memory) {
  if (!channel_.valid()) return failed_precondition("register_memory on a closed channel");
  return register_region(channel_.context(), memory);
}

Status MessageChannel::publish_segment(std::span<const std::byte> bytes,
                                       const transport::Region* region) {
  auto r = net_region(region, name_);
  if (!r.ok()) return r.status();
  auto t = channel_.send_bulk(++published_, bytes, **r);
  if (!t.ok()) return t.status();
  sends_.push_back(std::move(*t));
  return ok_status();
}

Status MessageChannel::check_segments() {
  while (!sends_.empty() && sends_.front().done()) {
    const Status& s = sends_.front().status();
    if (!s.ok()) return Status(s.code(), fmt::format("{}: {}", name_, s.message()));
    sends_.pop_front();
  }
  return ok_status();
}

Status MessageChannel::await_segments(std::chrono::milliseconds timeout) {
  const Deadline deadline(timeout);
  for (Transfer& t : sends_) {
    Status s = channel_.wait(t, deadline.left());
    if (!s.ok()) return Status(s.code(), fmt::format("{}: {}", name_, s.message()));
  }
  sends_.clear();
  return ok_status();
}

Status MessageChannel::receive_segment(std::span<std::byte> into, const transport::Region* region,
                                       std::chrono::milliseconds timeout) {
  auto r = net_region(region, name_);
  if (!r.ok()) return r.status();
  auto t = channel_.receive_bulk(++received_, into, **r);
  if (!t.ok()) return t.status();
  Status s = channel_.wait(*t, timeout);
  if (!s.ok()) return s;
  if (t->bytes() != into.size()) {
    return corruption(
        fmt::format("{} sent {} bytes for a segment of {}", name_, t->bytes(), into.size()));
  }
  return ok_status();
}

}  // namespace ferry::net
