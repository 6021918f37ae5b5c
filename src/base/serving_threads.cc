#include "base/serving_threads.h"

namespace ferry {

void ServingThreads::join_all() {
  for (Entry& e : threads_) e.thread.join();
  threads_.clear();
}

void ServingThreads::reap() {
  for (auto it = threads_.begin(); it != threads_.end();) {
    if (!it->done->load()) {
      ++it;
      continue;
    }
    it->thread.join();
    it = threads_.erase(it);
  }
}

}  // namespace ferry
