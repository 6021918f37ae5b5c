// How a `ferry` command is declared. Each command lives in its own cmd_*.cc,
// defines one add_*_command() listed in commands.h, and holds no logic that the
// library lacks: it parses flags, calls the library, prints.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <functional>
#include <string>

#include "ferry/status.h"

namespace ferry::cli {

// Exit codes shared by every command.
inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;  // the command ran and failed
inline constexpr int kExitUsage = 2;    // bad flags or arguments

// The one command chosen on the command line; set by its CLI11 callback.
struct Dispatch {
  std::function<int()> run;
};

// Adds `name` with its description and an example shown by --help, and makes
// running it call `run`.
CLI::App* add_command(CLI::App& app, Dispatch& dispatch, const std::string& name,
                      const std::string& description, const std::string& example,
                      std::function<int()> run);

// Prints "ferry: error: <status>" to stderr and returns kExitFailure: the command ran
// and a library call or a peer failed, whatever the code (a peer's invalid_argument too).
int report_error(const Status& status);

// Prints "ferry: usage error: <message>" to stderr and returns kExitUsage. Only for what
// the CLI layer finds wrong in the command line itself, checked before any work starts.
int usage_error(const Status& status);
int usage_error(const std::string& message);

// Command-line checks, run before any work; each message names the flag.
// `value` must be host:port or [ipv6]:port with a numeric port (0..65535).
Status check_host_port(const std::string& flag, const std::string& value);
// The bucket a flag asks for, in bytes: a positive multiple of 4 KiB.
Status check_bucket_mb(const std::string& flag, std::uint64_t mb);

// True when stdout is a terminal (progress bars are drawn only then).
bool stdout_is_terminal();

}  // namespace ferry::cli
