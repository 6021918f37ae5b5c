// What the replicate server and puller share besides the protocol (replicate.h).
#pragma once

#include <chrono>
#include <string>

#include "transport/net/channel.h"

namespace ferry::checkpoint::replicate {

// How long an idle server or puller sleeps waiting for UCX news.
inline constexpr std::chrono::milliseconds kPollInterval{50};

// The session token from `token_file`, or "" for FERRY_TOKEN / FERRY_TOKEN_FILE.
inline Result<net::Token> load_token(const std::string& token_file) {
  return token_file.empty() ? net::Token::from_env() : net::Token::from_file(token_file);
}

}  // namespace ferry::checkpoint::replicate
