#include "transport/net/context.h"

#include <fmt/format.h>
#include <poll.h>
#include <sys/epoll.h>
#include <ucp/api/ucp.h>
#include <ucs/debug/log_def.h>
#include <unistd.h>

#include <cerrno>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <sstream>

#include "base/log.h"
#include "base/status_macros.h"
#include "transport/net/auth.h"
#include "transport/net/poller.h"

namespace ferry::net {
namespace {

Status ucx_error(std::string_view call, ucs_status_t status) {
  return io_error(fmt::format("UCX {} failed: {}", call, ucs_status_string(status)));
}

// Captures what a ucp *_print_info function writes.
template <typename Print>
std::string capture(Print print) {
  char* text = nullptr;
  std::size_t size = 0;
  FILE* f = ::open_memstream(&text, &size);
  if (f == nullptr) return {};
  print(f);
  std::fclose(f);
  std::string out(text, size);
  std::free(text);
  return out;
}

// "tl/device" of every "resource N : md M dev D flags -- tl/device" line.
std::string parse_resources(const std::string& dump) {
  std::istringstream in(dump);
  std::string line;
  std::string out;
  while (std::getline(in, line)) {
    if (line.find("resource") == std::string::npos) continue;
    const auto dashes = line.find("-- ");
    if (dashes == std::string::npos) continue;
    std::string tl = line.substr(dashes + 3);
    while (!tl.empty() && (tl.back() == ' ' || tl.back() == '\n')) tl.pop_back();
    if (!out.empty()) out += ' ';
    out += tl;
  }
  return out;
}

// Creates a worker of `context` with its event fd and address.
Status open_worker(ucp_context_h context, bool serialized, ucp_worker_h* worker, int* event_fd,
                   std::vector<std::byte>* address) {
  ucp_worker_params_t wp{};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wp.thread_mode = serialized ? UCS_THREAD_MODE_SERIALIZED : UCS_THREAD_MODE_SINGLE;
  ucs_status_t st = ucp_worker_create(context, &wp, worker);
  if (st != UCS_OK) {
    *worker = nullptr;
    return ucx_error("ucp_worker_create", st);
  }
  st = ucp_worker_get_efd(*worker, event_fd);
  if (st != UCS_OK) return ucx_error("ucp_worker_get_efd", st);
  ucp_address_t* raw = nullptr;
  std::size_t bytes = 0;
  st = ucp_worker_get_address(*worker, &raw, &bytes);
  if (st != UCS_OK) return ucx_error("ucp_worker_get_address", st);
  const auto* begin = reinterpret_cast<const std::byte*>(raw);
  address->assign(begin, begin + bytes);
  ucp_worker_release_address(*worker, raw);
  return ok_status();
}

// UCX's own log lines go through ferry's logger (stderr, FERRY_LOG_LEVEL) instead of UCX's
// default handler, which prints to stdout, where they would mix with --json output.
ucs_log_func_rc_t ucx_log(const char* file, unsigned line, const char* /*function*/,
                          ucs_log_level_t level, const ucs_log_component_config_t* /*comp*/,
                          const char* message, va_list ap) {
  char text[1024];
  va_list copy;
  va_copy(copy, ap);
  std::vsnprintf(text, sizeof(text), message, copy);
  va_end(copy);
  const char* base = std::strrchr(file, '/');
  base = base == nullptr ? file : base + 1;
  if (level <= UCS_LOG_LEVEL_ERROR) {
    log::error("UCX {}:{} {}", base, line, text);
  } else if (level == UCS_LOG_LEVEL_WARN) {
    log::warn("UCX {}:{} {}", base, line, text);
  } else {
    log::debug("UCX {}:{} {}", base, line, text);
  }
  return UCS_LOG_FUNC_RC_STOP;
}

}  // namespace

void route_ucx_log() {
  static std::once_flag once;
  std::call_once(once, [] { ucs_log_push_handler(ucx_log); });
}

Result<NetPath> parse_net_path(std::string_view text) {
  if (text == "tcp") return NetPath::kTcp;
  if (text == "ucx") return NetPath::kUcx;
  return invalid_argument(fmt::format(
      "FERRY_NET_PATH is '{}'; it is 'tcp' (ferry's own TCP path, the default) or 'ucx' (UCX, "
      "for RDMA)",
      text));
}

Result<std::shared_ptr<Context>> Context::create(const ContextOptions& options) {
  NetPath path = NetPath::kTcp;
  if (options.path) {
    path = *options.path;
  } else if (const char* env = std::getenv("FERRY_NET_PATH"); env != nullptr && *env != '\0') {
    FERRY_ASSIGN_OR_RETURN(path, parse_net_path(env));
  }
  if (path == NetPath::kTcp) {
    auto ctx = std::make_shared<Context>(Private{});
    ctx->path_ = NetPath::kTcp;
    ctx->serialized_ = options.serialized;
    ctx->event_fd_ = ::epoll_create1(EPOLL_CLOEXEC);
    if (ctx->event_fd_ < 0) return errno_status("epoll_create1", "the net context", errno);
    const auto marker = handshake::tcp_path_address();
    ctx->worker_address_.assign(marker.begin(), marker.end());
    ctx->resources_ = "tcp (ferry)";
    return ctx;
  }
  route_ucx_log();
  ucp_config_t* config = nullptr;
  ucs_status_t st = ucp_config_read(nullptr, nullptr, &config);
  if (st != UCS_OK) return ucx_error("ucp_config_read", st);
  // The environment wins over the options: a user forcing UCX_TLS must get what they asked.
  const auto apply = [&](const char* name, const char* env, const std::string& value) -> Status {
    if (value.empty() || std::getenv(env) != nullptr) return ok_status();
    const ucs_status_t s = ucp_config_modify(config, name, value.c_str());
    if (s != UCS_OK) {
      return invalid_argument(
          fmt::format("UCX rejects {}={}: {}", env, value, ucs_status_string(s)));
    }
    return ok_status();
  };
  // UCX's TCP transport listens on ports of its own that parse what anybody sends before
  // ferry's handshake could refuse it (docs/security.md): left out unless asked for.
  Status s = apply("TLS", "UCX_TLS", options.transports.empty() ? "^tcp" : options.transports);
  if (s.ok()) s = apply("NET_DEVICES", "UCX_NET_DEVICES", options.devices);
  if (s.ok() && options.copy_sends) s = apply("ZCOPY_THRESH", "UCX_ZCOPY_THRESH", "inf");
  if (!s.ok()) {
    ucp_config_release(config);
    return s;
  }
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  params.features = UCP_FEATURE_TAG | UCP_FEATURE_STREAM | UCP_FEATURE_WAKEUP;
  auto ctx = std::make_shared<Context>(Private{});
  ctx->path_ = NetPath::kUcx;
  st = ucp_init(&params, config, &ctx->context_);
  ucp_config_release(config);
  if (st != UCS_OK) {
    ctx->context_ = nullptr;
    return ucx_error("ucp_init (check UCX_TLS / UCX_NET_DEVICES)", st);
  }
  s = open_worker(ctx->context_, options.serialized, &ctx->worker_, &ctx->main_event_fd_,
                  &ctx->worker_address_);
  if (!s.ok()) return s;
  ctx->serialized_ = options.serialized;
  ctx->event_fd_ = ::epoll_create1(EPOLL_CLOEXEC);
  if (ctx->event_fd_ < 0) return errno_status("epoll_create1", "the UCX context", errno);
  epoll_event ev{};
  ev.events = EPOLLIN;
  if (::epoll_ctl(ctx->event_fd_, EPOLL_CTL_ADD, ctx->main_event_fd_, &ev) != 0) {
    return errno_status("epoll_ctl", "the UCX worker's event fd", errno);
  }
  ucp_address_t* address = nullptr;
  std::size_t address_bytes = 0;
  st = ucp_worker_get_address(ctx->worker_, &address, &address_bytes);
  if (st != UCS_OK) return ucx_error("ucp_worker_get_address", st);
  const auto* begin = reinterpret_cast<const std::byte*>(address);
  ctx->worker_address_.assign(begin, begin + address_bytes);
  ucp_worker_release_address(ctx->worker_, address);
  ctx->resources_ =
      parse_resources(capture([&](FILE* f) { ucp_context_print_info(ctx->context_, f); }));
  log::debug("net: UCX {} context with transports {}", ucp_get_version_string(), ctx->resources_);
  return ctx;
}

Context::~Context() {
  if (worker_ != nullptr) ucp_worker_destroy(worker_);
  draining_.clear();  // their workers are gone, and their requests with them
  if (event_fd_ >= 0) ::close(event_fd_);
  if (context_ != nullptr) ucp_cleanup(context_);
}

Result<std::shared_ptr<Worker>> Context::add_worker() {
  std::shared_ptr<Worker> w(new Worker());
  if (path_ == NetPath::kTcp) {  // no UCX: only the address that names the path
    w->address_ = worker_address_;
    return w;
  }
  Status s = open_worker(context_, serialized_, &w->worker_, &w->event_fd_, &w->address_);
  if (!s.ok()) return s;
  epoll_event ev{};
  ev.events = EPOLLIN;
  if (::epoll_ctl(event_fd_, EPOLL_CTL_ADD, w->event_fd_, &ev) != 0) {
    return errno_status("epoll_ctl", "a UCX worker's event fd", errno);
  }
  w->context_ = shared_from_this();
  workers_.push_back(w.get());
  return w;
}

void Context::watch_once(int fd) {
  if (path_ == NetPath::kTcp) return;  // the channel's socket is watched already
  epoll_event ev{};
  ev.events = EPOLLIN | EPOLLRDHUP | EPOLLONESHOT;
  // Best effort: without it a death is still seen at the next call on the channel.
  (void)::epoll_ctl(event_fd_, EPOLL_CTL_ADD, fd, &ev);
}

Worker::~Worker() {
  if (context_) {
    std::erase(context_->workers_, this);
    (void)::epoll_ctl(context_->event_fd_, EPOLL_CTL_DEL, event_fd_, nullptr);
  }
  if (worker_ != nullptr) {
    ucp_worker_destroy(worker_);
    if (context_) context_->forget_drained(worker_);
  }
}

Result<std::uint64_t> Context::add_stream(int fd, std::function<bool()> flush) {
  epoll_event ev{};
  ev.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET;
  if (::epoll_ctl(event_fd_, EPOLL_CTL_ADD, fd, &ev) != 0) {
    return errno_status("epoll_ctl", "a net channel's socket", errno);
  }
  streams_.emplace_back(++last_stream_, std::move(flush));
  return last_stream_;
}

void Context::remove_stream(std::uint64_t id, int fd) {
  (void)::epoll_ctl(event_fd_, EPOLL_CTL_DEL, fd, nullptr);
  std::erase_if(streams_, [id](const auto& entry) { return entry.first == id; });
}

bool Context::progress() {
  bool any = false;
  if (path_ == NetPath::kTcp) {
    // By index: a flush may end its channel, which removes its entry.
    for (std::size_t i = 0; i < streams_.size(); ++i) any = streams_[i].second() || any;
    return any;
  }
  const auto turn = [&](ucp_worker_h worker) {
    while (ucp_worker_progress(worker) != 0) {
      any = true;
      for (std::size_t i = 0; i < after_turn_.size(); ++i) after_turn_[i].second();
    }
  };
  turn(worker_);
  for (Worker* w : workers_) turn(w->worker_);
  if (!draining_.empty()) reap_drained();
  return any;
}

std::uint64_t Context::add_after_turn(std::function<void()> f) {
  after_turn_.emplace_back(++last_after_turn_, std::move(f));
  return last_after_turn_;
}

void Context::remove_after_turn(std::uint64_t id) {
  std::erase_if(after_turn_, [id](const auto& entry) { return entry.first == id; });
}

void Context::drain(ucp_worker_h worker, void* request, std::vector<std::byte> buffer) {
  draining_.push_back({worker, request, std::move(buffer)});
}

void Context::reap_drained() {
  std::erase_if(draining_, [](const Draining& d) {
    if (ucp_request_check_status(d.request) == UCS_INPROGRESS) return false;
    ucp_request_free(d.request);
    return true;
  });
}

void Context::forget_drained(ucp_worker_h worker) {
  std::erase_if(draining_, [&](const Draining& d) { return d.worker == worker; });
}

bool Context::arm() {
  if (path_ == NetPath::kTcp) {
    // Edge-triggered: the events since the last arm say whether a socket had news since.
    epoll_event events[64];
    return ::epoll_wait(event_fd_, events, 64, 0) <= 0;
  }
  // UCS_ERR_BUSY: events are pending on that worker.
  if (ucp_worker_arm(worker_) != UCS_OK) return false;
  for (Worker* w : workers_) {
    if (ucp_worker_arm(w->worker_) != UCS_OK) return false;
  }
  return true;
}

void Context::wait(std::chrono::milliseconds timeout) {
  Poller poller(this);
  poller.progress();
  std::vector<pollfd> no_other_fds;
  (void)poller.wait(no_other_fds, timeout);
}

Result<MemoryRegion> Context::register_memory(std::span<std::byte> memory) {
  if (memory.empty()) return invalid_argument("cannot register an empty memory region");
  if (path_ == NetPath::kTcp) {  // the socket reads and writes any memory
    MemoryRegion region;
    region.context_ = shared_from_this();
    region.data_ = memory.data();
    region.size_ = memory.size();
    return region;
  }
  ucp_mem_map_params_t p{};
  p.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
  p.address = memory.data();
  p.length = memory.size();
  MemoryRegion region;
  const ucs_status_t st = ucp_mem_map(context_, &p, &region.memh_);
  if (st != UCS_OK) {
    region.memh_ = nullptr;
    return ucx_error(fmt::format("ucp_mem_map of {} bytes", memory.size()), st);
  }
  region.context_ = shared_from_this();
  region.data_ = memory.data();
  region.size_ = memory.size();
  return region;
}

std::uint32_t Context::allocate_bulk_id() {
  while (true) {
    std::uint32_t id = 0;
    std::array<std::uint8_t, 4> raw{};
    if (!random_bytes(raw).ok()) {
      id = static_cast<std::uint32_t>(bulk_ids_.size() + 1);  // still unique in this context
    } else {
      id = raw[0] | (raw[1] << 8) | (raw[2] << 16) | (std::uint32_t{raw[3]} << 24);
    }
    if (id != 0 && bulk_ids_.insert(id).second) return id;
  }
}

MemoryRegion::MemoryRegion(MemoryRegion&& o) noexcept
    : context_(std::move(o.context_)), memh_(o.memh_), data_(o.data_), size_(o.size_) {
  o.memh_ = nullptr;
  o.data_ = nullptr;
  o.size_ = 0;
}

MemoryRegion& MemoryRegion::operator=(MemoryRegion&& o) noexcept {
  if (this != &o) {
    reset();
    context_ = std::move(o.context_);
    memh_ = o.memh_;
    data_ = o.data_;
    size_ = o.size_;
    o.memh_ = nullptr;
    o.data_ = nullptr;
    o.size_ = 0;
  }
  return *this;
}

MemoryRegion::~MemoryRegion() { reset(); }

void MemoryRegion::reset() {
  if (memh_ != nullptr && context_) ucp_mem_unmap(context_->ucp(), memh_);
  memh_ = nullptr;
  context_.reset();
  data_ = nullptr;
  size_ = 0;
}

bool MemoryRegion::contains(const void* p, std::size_t n) const {
  const auto* b = static_cast<const std::byte*>(p);
  return data_ != nullptr && b >= data_ && n <= size_ &&
         b - data_ <= static_cast<std::ptrdiff_t>(size_ - n);
}

std::string endpoint_transports(ucp_ep_h ep) {
  const std::string dump = capture([&](FILE* f) { ucp_ep_print_info(ep, f); });
  // Lane lines look like "#   lane[0]:  2:tcp/lo.0 md[1]  -> md[1]/tcp/sysdev[255] am am_bw#0".
  std::istringstream in(dump);
  std::string line;
  std::string out;
  while (std::getline(in, line)) {
    const auto lane = line.find("lane[");
    if (lane == std::string::npos) continue;
    const auto colon = line.find(':', lane);
    if (colon == std::string::npos) continue;
    std::istringstream fields(line.substr(colon + 1));
    std::string rsc;
    fields >> rsc;  // "2:tcp/lo.0"
    if (const auto c = rsc.find(':'); c != std::string::npos) rsc = rsc.substr(c + 1);
    if (rsc.empty() || out.find(rsc) != std::string::npos) continue;
    if (!out.empty()) out += ' ';
    out += rsc;
  }
  return out.empty() ? "unknown" : out;
}

}  // namespace ferry::net
