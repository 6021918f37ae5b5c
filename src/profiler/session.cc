#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <ctime>
#include <thread>

#include "base/atomic_file.h"
#include "base/file_util.h"
#include "base/mutex.h"
#include "ferry/profiler.h"
#include "profiler/span.h"
#include "profiler/thread_buffer.h"
#include "profiler/trace_buffer.h"

namespace ferry::profiler {
namespace {

std::atomic<bool> g_session_live{false};

// Thread rings hold ~16k events; draining this often keeps them from filling.
constexpr auto kDrainPeriod = std::chrono::milliseconds(10);

std::uint32_t flags_for(const Config& c) {
  std::uint32_t f = detail::kOn;
  if (c.has(Content::kMemory)) f |= detail::kMemory;
  if (c.has(Content::kShapes)) f |= detail::kShapes;
  if (c.has(Content::kStack)) f |= detail::kStack;
  if (c.has(Content::kModule)) f |= detail::kModule;
  std::uint32_t detail_level = 0;
  if (c.level == Level::kLevel1) detail_level = 1;
  if (c.level == Level::kLevel2) detail_level = 2;
  return f | (detail_level << detail::kDetailShift);
}

Status make_dirs(const std::string& path) {
  std::string prefix;
  std::size_t pos = 0;
  while (pos != std::string::npos) {
    pos = path.find('/', pos + 1);
    prefix = path.substr(0, pos);
    if (prefix.empty()) continue;
    if (::mkdir(prefix.c_str(), 0755) != 0 && errno != EEXIST) {
      return errno_status("mkdir", prefix, errno);
    }
  }
  return ok_status();
}

std::int64_t wall_minus_monotonic_ns() {
  timespec wall, mono;
  ::clock_gettime(CLOCK_REALTIME, &wall);
  ::clock_gettime(CLOCK_MONOTONIC, &mono);
  return (static_cast<std::int64_t>(wall.tv_sec) - mono.tv_sec) * 1'000'000'000 +
         (static_cast<std::int64_t>(wall.tv_nsec) - mono.tv_nsec);
}

std::string file_safe(std::string_view s) {
  std::string out;
  for (char c : s) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '-' || c == '_' || c == '.';
    out.push_back(ok ? c : '_');
  }
  return out;
}

}  // namespace

struct Session::Impl {
  Config config;
  TraceIdentity who;
  std::string host;
  int pid = 0;

  Mutex mu;  // guards the drain into `trace` and what is marked with it
  TraceBuffer trace FERRY_GUARDED_BY(mu);
  std::int64_t step FERRY_GUARDED_BY(mu) = -1;
  int task_index FERRY_GUARDED_BY(mu) = 0;
  std::string task FERRY_GUARDED_BY(mu);
  std::vector<Event> scratch FERRY_GUARDED_BY(mu);
  // Touched only by the thread that calls the Session's methods.
  Range step_range, task_range;
  bool stopped = false;

  CondVar cv;
  bool quit FERRY_GUARDED_BY(mu) = false;
  std::thread drainer;

  explicit Impl(const Config& c) : config(c), trace(c.trace_budget_bytes) {}

  void drain_locked() FERRY_REQUIRES(mu) {
    const std::uint64_t overflowed = drain_all(&scratch);
    trace.add_overflow(overflowed);
    trace.add(&scratch, pid, config.has(Content::kModule));
  }

  void drain_loop() {
    MutexLock lock(mu);
    while (!quit) {
      cv.wait_for(mu, kDrainPeriod);
      if (!quit) drain_locked();
    }
  }

  std::string base_name() const FERRY_REQUIRES(mu) {
    std::string n = config.save_path + "/ferry_trace_rank" + std::to_string(who.rank) + "_" +
                    file_safe(who.role) + "_step" + (step >= 0 ? std::to_string(step) : "NA");
    if (config.discrete && !task.empty()) {
      char idx[16];
      std::snprintf(idx, sizeof(idx), "%03d", task_index);
      n += std::string("_task") + idx + "_" + file_safe(task);
    }
    return n;
  }

  // Drains and writes the pending trace; appends the paths written to `files`.
  Status write_locked(std::vector<std::string>* files) FERRY_REQUIRES(mu) {
    drain_locked();
    if (trace.empty()) return ok_status();
    TraceHeader h{who.rank,
                  who.role,
                  step,
                  config.discrete ? task : "",
                  host,
                  pid,
                  wall_minus_monotonic_ns(),
                  config.has(Content::kModule)};
    const std::string base = base_name();
    const std::string json = trace.take_json(h);
    const std::string path = base + ".json";
    Status s = write_file_atomic(path, json);
    if (!s.ok()) return s;
    files->push_back(path);
    if (config.analysis) {
      auto summary = summarize_text(json, path);
      if (!summary.ok()) return summary.status();
      s = write_file_atomic(base + ".summary.md", summary_markdown(*summary));
      if (!s.ok()) return s;
      s = write_file_atomic(base + ".summary.csv", summary_csv(*summary));
      if (!s.ok()) return s;
      files->push_back(base + ".summary.md");
      files->push_back(base + ".summary.csv");
    }
    return ok_status();
  }
};

Session::Session(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Result<std::unique_ptr<Session>> Session::start(const Config& config, TraceIdentity who) {
  bool expected = false;
  if (!g_session_live.compare_exchange_strong(expected, true)) {
    return failed_precondition("a profiler Session is already running in this process");
  }
  Status s = make_dirs(config.save_path);
  if (!s.ok()) {
    g_session_live.store(false);
    return s.with_context("profiler save_path");
  }
  auto impl = std::make_unique<Impl>(config);
  impl->who = std::move(who);
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  impl->host = host;
  impl->pid = static_cast<int>(::getpid());
  // Events left from an earlier session belong to no trace.
  std::vector<Event> stale;
  drain_all(&stale);
  detail::g_flags.store(flags_for(config), std::memory_order_relaxed);
  impl->drainer = std::thread([p = impl.get()] { p->drain_loop(); });
  return std::unique_ptr<Session>(new Session(std::move(impl)));
}

Session::~Session() { (void)stop(); }

const Config& Session::config() const { return impl_->config; }

void Session::begin_step(std::int64_t step) {
  MutexLock lock(impl_->mu);
  impl_->step = step;
  impl_->task_index = 0;
  impl_->step_range = range_start("ferry.step");
}

Result<std::vector<std::string>> Session::end_step() {
  range_end(impl_->step_range);
  impl_->step_range = {};
  std::vector<std::string> files;
  MutexLock lock(impl_->mu);
  if (!impl_->config.discrete) {
    Status s = impl_->write_locked(&files);
    if (!s.ok()) return s;
  }
  return files;
}

void Session::begin_task(std::string_view name) {
  MutexLock lock(impl_->mu);
  impl_->task = std::string(name);
  impl_->task_range = range_start(intern("task." + impl_->task));
}

Result<std::vector<std::string>> Session::end_task() {
  range_end(impl_->task_range);
  impl_->task_range = {};
  std::vector<std::string> files;
  MutexLock lock(impl_->mu);
  if (impl_->config.discrete) {
    Status s = impl_->write_locked(&files);
    ++impl_->task_index;
    if (!s.ok()) return s;
  }
  impl_->task.clear();
  return files;
}

Result<std::vector<std::string>> Session::stop() {
  if (impl_ == nullptr || impl_->stopped) return std::vector<std::string>{};
  range_end(impl_->task_range);
  range_end(impl_->step_range);
  impl_->task_range = impl_->step_range = {};
  {
    MutexLock lock(impl_->mu);
    impl_->quit = true;
  }
  impl_->cv.notify_all();
  impl_->drainer.join();
  detail::g_flags.store(0, std::memory_order_relaxed);
  std::vector<std::string> files;
  Status s;
  {
    MutexLock lock(impl_->mu);
    impl_->stopped = true;
    s = impl_->write_locked(&files);
  }
  g_session_live.store(false);
  if (!s.ok()) return s;
  return files;
}

}  // namespace ferry::profiler
