// How a `ferry` command is declared. Each command lives in its own cmd_*.cc,
// defines one add_*_command() listed in commands.h, and holds no logic that the
// library lacks: it parses flags, calls the library, prints.
#pragma once

#include <CLI/CLI.hpp>

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

// Prints "ferry: error: <status>" to stderr; returns kExitUsage for
// invalid_argument and kExitFailure otherwise.
int report_error(const Status& status);

// True when stdout is a terminal (progress bars are drawn only then).
bool stdout_is_terminal();

}  // namespace ferry::cli
