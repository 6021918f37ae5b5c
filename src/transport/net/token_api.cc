// The public token API (include/ferry/token.h): thin calls over net::Token and the token
// helpers of auth.h, so that `ferry token` checks a token exactly as a net session reads it.
#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include "base/file_util.h"
#include "base/status_macros.h"
#include "ferry/token.h"
#include "transport/net/auth.h"

namespace ferry::token {
namespace {

Found found(const net::Token& token) {
  const auto secret = token.bytes();
  return Found{token.source(), net::estimated_token_bits(
                                   {reinterpret_cast<const char*>(secret.data()), secret.size()})};
}

}  // namespace

double estimated_bits(std::string_view secret) { return net::estimated_token_bits(secret); }

Result<std::string> new_text(std::size_t bytes) { return net::new_token_text(bytes); }

Status write_file(const std::string& path, std::string_view text, bool replace) {
  const auto slash = path.rfind('/');
  if (slash != std::string::npos && slash > 0) {
    const std::string dir = path.substr(0, slash);
    if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
      return errno_status("mkdir", dir, errno);
    }
  }
  const int flags = O_WRONLY | O_CREAT | O_CLOEXEC | O_NOFOLLOW | (replace ? O_TRUNC : O_EXCL);
  ScopedFd fd(::open(path.c_str(), flags, 0600));
  if (!fd.valid()) {
    if (errno == EEXIST) {
      return already_exists(fmt::format(
          "{} exists; it may be the token other nodes use. Keep it, or pass --force to replace it",
          path));
    }
    return errno_status("create token file", path, errno);
  }
  // O_TRUNC keeps an existing file's mode: make it 0600 whatever it was.
  if (::fchmod(fd.get(), 0600) != 0) return errno_status("chmod", path, errno);
  FERRY_RETURN_IF_ERROR(write_all(fd.get(), as_bytes(std::string(text) + "\n"), path));
  if (::fsync(fd.get()) != 0) return errno_status("fsync", path, errno);
  return ok_status();
}

Result<Found> check_env() {
  FERRY_ASSIGN_OR_RETURN(const net::Token token, net::Token::from_env());
  return found(token);
}

Result<Found> check_file(const std::string& path) {
  FERRY_ASSIGN_OR_RETURN(const net::Token token, net::Token::from_file(path));
  return found(token);
}

}  // namespace ferry::token
