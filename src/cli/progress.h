// Progress of a long command on stderr, with the total and an ETA.
//
// On a terminal: one bar line, redrawn in place and ended with a newline when
// the work completes (or the bar is destroyed), so what follows starts on a
// line of its own. Elsewhere (a log, a pipe): a plain line at each quarter
// once the work has run for a few seconds, so a short command prints nothing.
// FERRY_PROGRESS=off prints nothing; FERRY_PROGRESS=plain prints the quarter
// lines from the start. Sizes are binary: MiB = 2^20 bytes, GiB = 2^30.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace ferry::cli {

// "512.0 MiB", "2.32 GiB": the unit convention of every size the CLI prints.
std::string format_bytes(std::uint64_t bytes);

class ProgressBar {
 public:
  explicit ProgressBar(std::string label);
  ~ProgressBar();  // ends the bar's line if it was left open
  // Redraws at most ~10 times a second; always draws completion.
  void update(std::uint64_t done, std::uint64_t total);

 private:
  enum class Mode { kOff, kTerminal, kPlain, kPlainAlways };
  void draw_terminal(std::uint64_t done, std::uint64_t total, double secs);
  void print_plain(std::uint64_t done, std::uint64_t total, double secs);

  std::string label_;
  Mode mode_;
  bool line_open_ = false;  // a terminal bar is drawn and its line not ended
  bool finished_ = false;
  int quarters_printed_ = 0;
  std::chrono::steady_clock::time_point start_, last_;
};

}  // namespace ferry::cli
