#include "transport/net/net_transport.h"

#include "base/status_macros.h"
#include "transport/net/address.h"
#include "transport/net/auth.h"
#include "transport/net/channel.h"
#include "transport/net/context.h"
#include "transport/net/message_channel.h"
#include "transport/net/message_listener.h"
#include "transport/shm/memfd_ring.h"

namespace ferry::net {

namespace {

Result<Token> session_secret(const transport::TransportConfig& config) {
  if (!config.secret.empty()) return Token::from_string(config.secret, "the given session secret");
  auto token =
      config.secret_file.empty() ? Token::from_env() : Token::from_file(config.secret_file);
  if (!token.ok() && token.status().code() == Code::kNotFound && config.secret_file.empty()) {
    return Status(Code::kUnauthenticated,
                  "a net session needs its secret: set FERRY_TOKEN, or FERRY_TOKEN_FILE (or "
                  "--token-file) to a file of mode 0600 holding it, the same on every node");
  }
  return token;
}

class NetTransport final : public transport::Transport {
 public:
  NetTransport(std::shared_ptr<Context> context, Token token, const transport::TransportConfig& c)
      : context_(std::move(context)),
        token_(std::move(token)),
        protection_(c.protection),
        on_refused_(c.on_refused) {}

  const std::string& scheme() const override { return scheme_; }
  bool shares_memory() const override { return false; }
  bool connect_in_slices() const override { return false; }

  Result<std::unique_ptr<transport::Listener>> listen(const std::string& address) override {
    FERRY_ASSIGN_OR_RETURN(auto listener,
                           Listener::bind(context_, address, token_, {.on_refused = on_refused_}));
    return std::unique_ptr<transport::Listener>(
        std::make_unique<MessageListener>(context_, std::move(listener), protection_));
  }

  using transport::Transport::connect;
  Result<std::unique_ptr<transport::Channel>> connect(const std::string& address,
                                                      std::chrono::milliseconds timeout,
                                                      const std::string& role) override {
    FERRY_ASSIGN_OR_RETURN(auto channel,
                           net::connect(context_, address, token_, timeout, {.role = role}));
    // The sender chooses how segments travel; this end only sets the least it takes.
    channel.set_bulk_protection(WireProtect::kNone, protection_);
    return std::unique_ptr<transport::Channel>(
        std::make_unique<MessageChannel>(std::move(channel)));
  }

  Result<std::string> reachable_address(const std::string& listening,
                                        const std::string& via) const override {
    FERRY_ASSIGN_OR_RETURN(HostPort bound, split_host_port(listening));
    if (!every_interface(bound.host)) return listening;
    auto seen = split_host_port(via);
    if (!seen.ok() || seen->host.empty() || every_interface(seen->host)) {
      return failed_precondition("cannot tell which host reaches the listener at " + listening +
                                 (via.empty() ? "" : " from '" + via + "'"));
    }
    return join_host_port(seen->host, bound.port);
  }

  // The ring is host memory like shm's; each listener or channel registers it with UCX.
  Result<std::unique_ptr<transport::Ring>> allocate_ring(std::uint32_t slots,
                                                         std::uint64_t slot_bytes) override {
    return shm::boxed_ring(shm::MemfdRing::create(slots, slot_bytes));
  }

 private:
  const std::string scheme_ = "net";
  std::shared_ptr<Context> context_;
  Token token_;
  WireProtect protection_;
  std::function<void(const Status&)> on_refused_;
};

}  // namespace

Result<std::unique_ptr<transport::Transport>> create_transport(
    const transport::TransportConfig& config) {
  FERRY_ASSIGN_OR_RETURN(Token token, session_secret(config));
  FERRY_ASSIGN_OR_RETURN(auto context, Context::create({.copy_sends = config.copy_sends,
                                                        .serialized = config.serialized}));
  return std::unique_ptr<transport::Transport>(
      std::make_unique<NetTransport>(std::move(context), std::move(token), config));
}

}  // namespace ferry::net
