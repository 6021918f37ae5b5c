#include "checkpoint/readahead.h"

namespace ferry::checkpoint {

std::pair<std::size_t, std::size_t> AheadWindow::advance(std::size_t i) {
  if (next_ <= i) {  // nothing named ahead of i: start the window after it
    next_ = i + 1;
    ahead_ = 0;
  } else {
    ahead_ -= bytes_[i];  // i leaves the window
  }
  const std::size_t first = next_;
  while (next_ < bytes_.size() && next_ - (i + 1) < max_entries_ &&
         (ahead_ + bytes_[next_] <= max_bytes_ || next_ == i + 1)) {
    ahead_ += bytes_[next_++];
  }
  return {first, next_};
}

SliceReadahead::~SliceReadahead() {
  {
    MutexLock lock(mu_);
    stop_ = true;
    queue_.clear();
  }
  cv_.notify_all();
  if (worker_.joinable()) worker_.join();
}

void SliceReadahead::hint(Key key) {
  {
    MutexLock lock(mu_);
    if (stop_ || !seen_.insert(key).second) return;
    queue_.push_back(key);
    if (!worker_.joinable()) worker_ = std::thread([this] { run(); });
  }
  cv_.notify_one();
}

void SliceReadahead::run() {
  while (true) {
    Key key;
    {
      MutexLock lock(mu_);
      while (!stop_ && queue_.empty()) cv_.wait(mu_);
      if (stop_) return;
      key = queue_.front();
      queue_.pop_front();
    }
    verify_(key);  // unlocked: hint() queues more meanwhile
  }
}

}  // namespace ferry::checkpoint
