// Compiled by clang with -Wthread-safety -Werror (tests/structure/tests.cmake), not linked:
// built as is it must compile, and with FERRY_PROBE_UNLOCKED_READ it must not, so the
// annotations in base/mutex.h are known to be seen by the analysis.
#include "base/mutex.h"

namespace {

class Counter {
 public:
  void add() {
    ferry::MutexLock lock(mu_);
    ++n_;
  }
  int wait_and_read() {
    ferry::MutexLock lock(mu_);
    cv_.wait_for(mu_, std::chrono::milliseconds(1));
    return n_;
  }
#ifdef FERRY_PROBE_UNLOCKED_READ
  int read_unlocked() { return n_; }
#endif

 private:
  ferry::Mutex mu_;
  ferry::CondVar cv_;
  int n_ FERRY_GUARDED_BY(mu_) = 0;
};

}  // namespace

int probe() {
  Counter c;
  c.add();
  return c.wait_and_read();
}
