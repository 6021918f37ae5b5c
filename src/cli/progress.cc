#include "cli/progress.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <utility>

namespace ferry::cli {
namespace {

// Plain lines wait this long, so a quick command stays quiet in logs.
constexpr double kPlainAfterSeconds = 5.0;

std::string eta_text(std::uint64_t done, std::uint64_t total, double secs) {
  if (done == 0 || done >= total || secs <= 0) return done >= total ? "done" : "ETA --";
  const double left = secs * static_cast<double>(total - done) / static_cast<double>(done);
  const auto s = static_cast<unsigned long long>(left + 0.5);
  char buf[48];
  if (s >= 3600) {
    std::snprintf(buf, sizeof(buf), "ETA %lluh%02llum", s / 3600, s / 60 % 60);
  } else {
    std::snprintf(buf, sizeof(buf), "ETA %llum%02llus", s / 60, s % 60);
  }
  return buf;
}

std::string rate_text(std::uint64_t done, double secs) {
  if (secs <= 0) return "-- MiB/s";
  return format_bytes(static_cast<std::uint64_t>(static_cast<double>(done) / secs)) + "/s";
}

}  // namespace

std::string format_bytes(std::uint64_t bytes) {
  char buf[48];
  const double b = static_cast<double>(bytes);
  if (bytes >= (std::uint64_t{1} << 30)) {
    std::snprintf(buf, sizeof(buf), "%.2f GiB", b / (1ull << 30));
  } else {
    std::snprintf(buf, sizeof(buf), "%.1f MiB", b / (1ull << 20));
  }
  return buf;
}

ProgressBar::ProgressBar(std::string label)
    : label_(std::move(label)), start_(std::chrono::steady_clock::now()), last_() {
  const char* env = std::getenv("FERRY_PROGRESS");
  if (env != nullptr && std::strcmp(env, "off") == 0) {
    mode_ = Mode::kOff;
  } else if (env != nullptr && std::strcmp(env, "plain") == 0) {
    mode_ = Mode::kPlainAlways;
  } else {
    mode_ = ::isatty(STDERR_FILENO) == 1 ? Mode::kTerminal : Mode::kPlain;
  }
}

ProgressBar::~ProgressBar() {
  if (line_open_) std::fputc('\n', stderr);
}

void ProgressBar::update(std::uint64_t done, std::uint64_t total) {
  if (mode_ == Mode::kOff || total == 0 || finished_) return;
  if (done > total) done = total;
  const auto now = std::chrono::steady_clock::now();
  const double secs = std::chrono::duration<double>(now - start_).count();
  if (mode_ == Mode::kTerminal) {
    if (done < total && now - last_ < std::chrono::milliseconds(100)) return;
    last_ = now;
    draw_terminal(done, total, secs);
  } else {
    print_plain(done, total, secs);
  }
  finished_ = done == total;
}

void ProgressBar::draw_terminal(std::uint64_t done, std::uint64_t total, double secs) {
  constexpr int kWidth = 30;
  const double frac = static_cast<double>(done) / static_cast<double>(total);
  const int filled = static_cast<int>(frac * kWidth);
  // \033[K clears what a longer previous draw left at the end of the line.
  std::fprintf(stderr, "\r%s [%.*s%*s] %5.1f%% %s of %s  %s  %s\033[K", label_.c_str(), filled,
               "##############################", kWidth - filled, "", frac * 100.0,
               format_bytes(done).c_str(), format_bytes(total).c_str(),
               rate_text(done, secs).c_str(), eta_text(done, total, secs).c_str());
  line_open_ = done < total;
  if (!line_open_) std::fputc('\n', stderr);  // the summary that follows gets its own line
  std::fflush(stderr);
}

void ProgressBar::print_plain(std::uint64_t done, std::uint64_t total, double secs) {
  const int quarter = static_cast<int>(4 * done / total);  // 0..4
  if (quarter <= quarters_printed_) return;
  if (mode_ == Mode::kPlain && secs < kPlainAfterSeconds) return;
  quarters_printed_ = quarter;
  std::fprintf(stderr, "%s: %d%% of %s, %s, %s\n", label_.c_str(), quarter * 25,
               format_bytes(total).c_str(), rate_text(done, secs).c_str(),
               eta_text(done, total, secs).c_str());
  std::fflush(stderr);
}

}  // namespace ferry::cli
