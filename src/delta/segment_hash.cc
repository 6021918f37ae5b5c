#include "delta/segment_hash.h"

#include <xxhash.h>

#include <memory>

namespace ferry::delta {
namespace {

struct StateFree {
  void operator()(XXH3_state_t* s) const { XXH3_freeState(s); }
};

// One state per thread, kept: it is 576 bytes, allocated aligned.
XXH3_state_t* thread_state() {
  thread_local std::unique_ptr<XXH3_state_t, StateFree> owned(XXH3_createState());
  return owned.get();
}

}  // namespace

SegmentHash::SegmentHash(std::span<const std::byte> data) : data_(data) {
  XXH3_64bits_reset(thread_state());
}

void SegmentHash::up_to(std::size_t end) {
  if (end > hashed_) XXH3_64bits_update(thread_state(), data_.data() + hashed_, end - hashed_);
  hashed_ = end;
}

std::uint64_t SegmentHash::finish() {
  up_to(data_.size());
  return XXH3_64bits_digest(thread_state());
}

}  // namespace ferry::delta
