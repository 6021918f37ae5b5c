#include "transport/shm/message_listener.h"

#include "transport/shm/message_channel.h"

namespace ferry::shm {

MessageListener::MessageListener(shm::Listener listener)
    : listener_(std::move(listener)), address_(listener_.address()) {}

Result<std::unique_ptr<transport::Channel>> MessageListener::accept(
    std::chrono::milliseconds timeout) {
  if (listener_.fd() < 0)
    return failed_precondition("accept on the closed listener at " + address_);
  auto channel = listener_.accept(timeout);
  if (!channel.ok()) return channel.status();
  return std::unique_ptr<transport::Channel>(std::make_unique<MessageChannel>(std::move(*channel)));
}

}  // namespace ferry::shm
