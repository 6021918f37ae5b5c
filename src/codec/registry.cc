#include "codec/registry.h"

#include "base/mutex.h"
#include "base/thread_annotations.h"
#include "codec/delta_codec.h"
#include "codec/testing.h"

namespace ferry::codec {
namespace {

// The test hooks of codec/testing.h.
struct Hooks {
  Mutex mu;
  testing::SendCodecFactory send_factory FERRY_GUARDED_BY(mu);
  testing::ExtraReceiveCodec extra_receive FERRY_GUARDED_BY(mu);
};
Hooks& hooks() {
  static Hooks h;
  return h;
}

}  // namespace

std::unique_ptr<SendCodec> make_send_codec(const sync::SyncOptions& options) {
  {
    Hooks& h = hooks();
    MutexLock lock(h.mu);
    if (h.send_factory) return h.send_factory();
  }
  if (options.delta != sync::DeltaMode::kOff) {
    return std::make_unique<DeltaSendCodec>(
        DeltaCodecOptions{options.delta, options.delta_snapshot_limit, options.delta_threads});
  }
  return nullptr;
}

const ReceiveCodec* receive_codec(std::uint8_t id) {
  static const DeltaReceiveCodec delta;
  if (id == kDeltaId) return &delta;
  Hooks& h = hooks();
  MutexLock lock(h.mu);
  if (id != wire::kDense && id == h.extra_receive.id) return h.extra_receive.codec;
  return nullptr;
}

void testing::set_send_codec_factory(SendCodecFactory factory) {
  Hooks& h = hooks();
  MutexLock lock(h.mu);
  h.send_factory = std::move(factory);
}

void testing::set_extra_receive_codec(ExtraReceiveCodec extra) {
  Hooks& h = hooks();
  MutexLock lock(h.mu);
  h.extra_receive = extra;
}

}  // namespace ferry::codec
