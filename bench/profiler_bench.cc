// Cost of one span when profiling is off and on. Prints figures; asserts nothing.
// docs/benchmarks.md quotes them (targets: < 5 ns off, < 100 ns on).
//
// The enabled cases record batches that fit the thread's ring and drain it with the timer
// paused, so every span takes the full recording path (a full ring would take the cheaper
// drop path and flatter the figure). Serializing to JSON happens on the Session's drain
// thread, off the recording thread, and is not measured here.
#include <benchmark/benchmark.h>

#include <vector>

#include "profiler/span.h"
#include "profiler/thread_buffer.h"

namespace {

namespace prof = ferry::profiler;
constexpr int kBatch = 4096;  // < the ring's 16384 events

class Flags {
 public:
  explicit Flags(std::uint32_t extra) {
    prof::detail::g_flags.store(prof::detail::kOn | extra, std::memory_order_relaxed);
  }
  ~Flags() { prof::detail::g_flags.store(0, std::memory_order_relaxed); }
};

template <typename Body>
void run_batched(benchmark::State& state, std::uint32_t extra, Body body) {
  Flags flags(extra);
  std::vector<prof::Event> sink;
  sink.reserve(kBatch * 2);
  std::uint64_t overflowed = 0;
  for (auto _ : state) {
    for (int i = 0; i < kBatch; ++i) body();
    state.PauseTiming();
    overflowed += prof::drain_all(&sink);
    sink.clear();
    state.ResumeTiming();
  }
  state.counters["per_event"] = benchmark::Counter(
      kBatch, benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
  state.counters["overflowed"] = static_cast<double>(overflowed);
}

void BM_SpanDisabled(benchmark::State& state) {
  for (auto _ : state) {
    prof::Span span("bench.span");
    benchmark::DoNotOptimize(&span);
  }
}
BENCHMARK(BM_SpanDisabled);

void BM_SpanDisabledWithArg(benchmark::State& state) {
  for (auto _ : state) {
    prof::Span span("bench.span");
    span.arg("bucket", 7);
    benchmark::DoNotOptimize(&span);
  }
}
BENCHMARK(BM_SpanDisabledWithArg);

void BM_MarkDisabled(benchmark::State& state) {
  for (auto _ : state) prof::mark("bench.mark");
}
BENCHMARK(BM_MarkDisabled);

void BM_SpanEnabled(benchmark::State& state) {
  run_batched(state, 0, [] {
    prof::Span span("bench.span");
    benchmark::DoNotOptimize(&span);
  });
}
BENCHMARK(BM_SpanEnabled);

void BM_SpanEnabledStack(benchmark::State& state) {
  run_batched(state, prof::detail::kStack, [] {
    prof::Span span("bench.span");
    benchmark::DoNotOptimize(&span);
  });
}
BENCHMARK(BM_SpanEnabledStack);

void BM_SpanEnabledIntArg(benchmark::State& state) {
  run_batched(state, 0, [] {
    prof::Span span("bench.span");
    span.arg("bucket", 7);
    benchmark::DoNotOptimize(&span);
  });
}
BENCHMARK(BM_SpanEnabledIntArg);

void BM_SpanEnabledMemory(benchmark::State& state) {
  run_batched(state, prof::detail::kMemory, [] {
    prof::Span span("bench.span");
    benchmark::DoNotOptimize(&span);
  });
}
BENCHMARK(BM_SpanEnabledMemory);

void BM_RangeEnabled(benchmark::State& state) {
  run_batched(state, 0, [] {
    auto r = prof::range_start("bench.range");
    prof::range_end(r);
  });
}
BENCHMARK(BM_RangeEnabled);

void BM_MarkEnabled(benchmark::State& state) {
  run_batched(state, 0, [] { prof::mark("bench.mark"); });
}
BENCHMARK(BM_MarkEnabled);

}  // namespace

BENCHMARK_MAIN();
