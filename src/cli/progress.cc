#include "cli/progress.h"

#include <unistd.h>

#include <cstdio>

namespace ferry::cli {

ProgressBar::ProgressBar(std::string label)
    : label_(std::move(label)),
      enabled_(::isatty(STDERR_FILENO) == 1),
      start_(std::chrono::steady_clock::now()),
      last_() {}

ProgressBar::~ProgressBar() {
  if (drawn_) std::fputc('\n', stderr);
}

void ProgressBar::update(std::uint64_t done, std::uint64_t total) {
  if (!enabled_ || total == 0) return;
  const auto now = std::chrono::steady_clock::now();
  if (done < total && now - last_ < std::chrono::milliseconds(100)) return;
  last_ = now;
  constexpr int kWidth = 30;
  const double frac = static_cast<double>(done) / static_cast<double>(total);
  const int filled = static_cast<int>(frac * kWidth);
  const double secs = std::chrono::duration<double>(now - start_).count();
  const double mbps = secs > 0 ? static_cast<double>(done) / secs / 1e6 : 0.0;
  std::fprintf(stderr, "\r%s [%.*s%*s] %5.1f%% %8.1f MB/s", label_.c_str(), filled,
               "##############################", kWidth - filled, "", frac * 100.0, mbps);
  std::fflush(stderr);
  drawn_ = true;
}

}  // namespace ferry::cli
