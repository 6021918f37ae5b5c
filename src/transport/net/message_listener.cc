#include "transport/net/message_listener.h"

#include "transport/net/message_channel.h"

namespace ferry::net {

MessageListener::MessageListener(std::shared_ptr<Context> context, net::Listener listener,
                                 WireProtect segment_protection)
    : context_(std::move(context)),
      listener_(std::move(listener)),
      address_(listener_.address()),
      segment_protection_(segment_protection) {}

Result<std::unique_ptr<transport::Channel>> MessageListener::accept(
    std::chrono::milliseconds timeout) {
  if (!open_) return failed_precondition("accept on the closed listener at " + address_);
  auto channel = listener_.accept(timeout);
  if (!channel.ok()) return channel.status();
  channel->set_bulk_protection(segment_protection_, WireProtect::kNone);
  return std::unique_ptr<transport::Channel>(std::make_unique<MessageChannel>(std::move(*channel)));
}

void MessageListener::close() {
  listener_ = net::Listener();
  open_ = false;
}

Result<std::unique_ptr<transport::Region>> MessageListener::register_memory(
    std::span<std::byte> memory) {
  return register_region(*context_, memory);
}

std::unique_ptr<transport::Poller> MessageListener::poller() const {
  return std::make_unique<ProgressPoller>(context_);
}

}  // namespace ferry::net
