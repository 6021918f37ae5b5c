// net's transport::Listener: a net::Listener on "host:port" whose accepted peers have
// authenticated with the session token; their channels live on its Context.
#pragma once

#include <memory>
#include <string>

#include "ferry/wire_protect.h"
#include "transport/net/channel.h"
#include "transport/net/context.h"
#include "transport/transport.h"

namespace ferry::net {

class MessageListener final : public transport::Listener {
 public:
  // `segment_protection`: how accepted channels protect the segments they publish.
  MessageListener(std::shared_ptr<Context> context, net::Listener listener,
                  WireProtect segment_protection);

  Result<std::unique_ptr<transport::Channel>> accept(std::chrono::milliseconds timeout) override;
  int fd() const override { return open_ ? listener_.fd() : -1; }
  const std::string& address() const override { return address_; }
  void close() override;
  Result<std::unique_ptr<transport::Region>> register_memory(std::span<std::byte> memory) override;
  std::unique_ptr<transport::Poller> poller() const override;

 private:
  std::shared_ptr<Context> context_;
  net::Listener listener_;
  std::string address_;
  WireProtect segment_protection_;
  bool open_ = true;
};

}  // namespace ferry::net
