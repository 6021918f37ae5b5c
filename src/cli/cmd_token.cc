// ferry token: makes session tokens for net sessions and checks the one in use.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "cli/commands.h"
#include "ferry/token.h"

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

int run_new(const std::string& path_arg, bool force) {
  auto text = token::new_text();
  if (!text.ok()) return report_error(text.status());
  if (path_arg == "-") {
    std::printf("%s\n", text->c_str());
    return kExitOk;
  }
  auto path = path_arg.empty() ? default_token_path() : Result<std::string>(path_arg);
  if (!path.ok()) return report_error(path.status());
  Status st = token::write_file(*path, *text, force);
  if (!st.ok()) return report_error(st);
  std::printf(
      "wrote a 256-bit token to %s (mode 0600)\n"
      "copy it to every node of the job (e.g. scp -p), then on each: export FERRY_TOKEN_FILE=%s\n",
      path->c_str(), path->c_str());
  return kExitOk;
}

int run_check(const std::string& path) {
  auto found = path.empty() ? token::check_env() : token::check_file(path);
  if (!found.ok()) {
    (void)report_error(found.status());
    return kExitFailure;  // a missing or weak token is the finding, not a usage error
  }
  std::printf("%s: a token of about %.0f bits (at least %.0f needed): OK\n", found->source.c_str(),
              found->bits, token::kMinBits);
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

  auto check_path = std::make_shared<std::string>();
  CLI::App* check = add_command(
      *token, dispatch, "check",
      "Reads the token net sessions would use (FERRY_TOKEN, else FERRY_TOKEN_FILE), or the "
      "token file given, and says whether it is strong enough, without printing it.",
      "FERRY_TOKEN_FILE=~/.ferry/token ferry token check",
      [check_path] { return run_check(*check_path); });
  check->add_option("path", *check_path,
                    "Token file to check as net sessions would (default: the environment's)");
}

}  // namespace ferry::cli
