// ferry token: makes session tokens for net sessions and checks the one in use.
#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "base/file_util.h"
#include "cli/commands.h"
#include "transport/net/auth.h"

namespace ferry::cli {
namespace {

// ~/.ferry/token, the path the docs suggest for FERRY_TOKEN_FILE.
Result<std::string> default_token_path() {
  const char* home = std::getenv("HOME");
  if (home == nullptr || *home == '\0') {
    return invalid_argument("HOME is not set: name the token file, e.g. ferry token new ./token");
  }
  return std::string(home) + "/.ferry/token";
}

// Writes `text` to a new file `path` with mode 0600; an existing file is kept unless `force`.
Status write_token_file(const std::string& path, const std::string& text, bool force) {
  const auto slash = path.rfind('/');
  if (slash != std::string::npos && slash > 0) {
    const std::string dir = path.substr(0, slash);
    if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
      return errno_status("mkdir", dir, errno);
    }
  }
  int flags = O_WRONLY | O_CREAT | O_CLOEXEC | O_NOFOLLOW | (force ? O_TRUNC : O_EXCL);
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
  Status st = write_all(fd.get(), as_bytes(text + "\n"), path);
  if (!st.ok()) return st;
  if (::fsync(fd.get()) != 0) return errno_status("fsync", path, errno);
  return ok_status();
}

int run_new(const std::string& path_arg, bool force) {
  auto text = net::new_token_text();
  if (!text.ok()) return report_error(text.status());
  if (path_arg == "-") {
    std::printf("%s\n", text->c_str());
    return kExitOk;
  }
  auto path = path_arg.empty() ? default_token_path() : Result<std::string>(path_arg);
  if (!path.ok()) return report_error(path.status());
  Status st = write_token_file(*path, *text, force);
  if (!st.ok()) return report_error(st);
  std::printf(
      "wrote a 256-bit token to %s (mode 0600)\n"
      "copy it to every node of the job (e.g. scp -p), then on each: export FERRY_TOKEN_FILE=%s\n",
      path->c_str(), path->c_str());
  return kExitOk;
}

int run_check() {
  auto token = net::Token::from_env();
  if (!token.ok()) {
    (void)report_error(token.status());
    return kExitFailure;  // a missing or weak token is the finding, not a usage error
  }
  std::printf("%s: a token of about %.0f bits (at least %.0f needed): OK\n",
              token->source().c_str(),
              net::estimated_token_bits(
                  {reinterpret_cast<const char*>(token->bytes().data()), token->bytes().size()}),
              net::kMinTokenBits);
  return kExitOk;
}

}  // namespace

void add_token_command(CLI::App& app, Dispatch& dispatch) {
  CLI::App* token = app.add_subcommand("token", "Make and check session tokens for net sessions");
  token->require_subcommand(1);

  auto path = std::make_shared<std::string>();
  auto force = std::make_shared<bool>(false);
  CLI::App* make = add_command(
      *token, dispatch, "new",
      "Writes a fresh random 256-bit token to a file with mode 0600 (default ~/.ferry/token; "
      "'-' prints it instead). Net sessions refuse tokens under 128 bits.",
      "ferry token new && export FERRY_TOKEN_FILE=~/.ferry/token",
      [path, force] { return run_new(*path, *force); });
  make->add_option("path", *path, "Token file to create (default ~/.ferry/token; '-': stdout)");
  make->add_flag("--force", *force, "Replace the file if it exists");

  add_command(*token, dispatch, "check",
              "Reads the token net sessions would use (FERRY_TOKEN, else FERRY_TOKEN_FILE) and "
              "says whether it is strong enough, without printing it.",
              "FERRY_TOKEN_FILE=~/.ferry/token ferry token check", [] { return run_check(); });
}

}  // namespace ferry::cli
