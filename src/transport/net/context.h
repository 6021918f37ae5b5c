// The UCX side of the net transport: one ucp context and one worker (single-thread
// mode) per Context, and memory registered with it for the bulk path.
//
// Everything here is single-threaded: one thread owns a Context and all the listeners,
// channels, regions and transfers made from it (or, with ContextOptions::serialized,
// several threads take turns under the caller's mutex). The worker's event fd lets that
// thread's loop (net::Poller, poller.h) wait on net peers and shm peers together.
#pragma once

#include <ucp/api/ucp_def.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_set>
#include <utility>
#include <vector>

#include "ferry/status.h"

namespace ferry::net {

// What carries a Context's channels after the handshake.
enum class NetPath {
  // ferry's own (tcp_stream.cc): the authenticated TCP socket carries the sealed frames and the
  // bulk bytes. No UCX code runs, so nothing but ferry's listener is reachable on the network.
  kTcp,
  // UCX, for RDMA (InfiniBand, RoCE: rc, dc, ud). UCX's TCP transport is left out (UCX_TLS
  // "^tcp") unless UCX_TLS or `transports` names it: its ports would listen to anybody.
  kUcx,
};
// "tcp" or "ucx"; kInvalidArgument naming `text` otherwise.
Result<NetPath> parse_net_path(std::string_view text);

struct ContextOptions {
  // Unset: the environment's FERRY_NET_PATH ("tcp" or "ucx"), else kTcp. Both ends must use
  // the same; the handshake refuses a peer that does not, naming the setting.
  std::optional<NetPath> path;
  // UCX transports to ask for (UCX_TLS syntax, e.g. "tcp" or "rc,sm,self"), used only when
  // the environment sets no UCX_TLS. Default "": UCX picks from all it finds (RDMA when
  // present, shared memory between processes on one host, TCP otherwise). See
  // docs/transport-net.md.
  std::string transports;
  // Network devices (UCX_NET_DEVICES syntax, e.g. "mlx5_0:1" or "eth0"), likewise only when
  // UCX_NET_DEVICES is unset. Default "": all.
  std::string devices;
  // Copies every message into UCX's buffers rather than sending it zero-copy. UCX 1.13's
  // TCP transport aborts the process (a zero-copy completion counted twice) when a peer
  // ends while zero-copy sends to it are queued; a server that sends to untrusted peers
  // and has no need for speed (the replicate server) turns this on. Halves bulk rates.
  bool copy_sends = false;
  // Several threads use this Context, one at a time (the caller serializes them, e.g. under
  // a mutex): the worker is made UCS_THREAD_MODE_SERIALIZED. Default false: SINGLE, which
  // UCX reserves for a worker only the thread that made it touches.
  bool serialized = false;
};

class MemoryRegion;
class Context;

// A ucp worker of a Context besides its main one: each connect() gets its own (see
// Context::add_worker). Removes itself from the Context's event fd and progress loop when
// destroyed; keeps the Context alive until then.
class Worker {
 public:
  ~Worker();
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;
  ucp_worker_h get() const { return worker_; }
  // The address (ucp_worker_get_address) a peer creates its endpoint from.
  const std::vector<std::byte>& address() const { return address_; }

 private:
  friend class Context;
  Worker() = default;
  std::shared_ptr<Context> context_;
  ucp_worker_h worker_ = nullptr;
  int event_fd_ = -1;
  std::vector<std::byte> address_;
};

// Sends UCX's log lines to ferry's logger (stderr) instead of stdout. Context::create calls
// it; idempotent, thread-safe.
void route_ucx_log();

class Context : public std::enable_shared_from_this<Context> {
  friend class Worker;

 public:
  // On kUcx: ucp_init with the tag, stream and wakeup features, and one worker. On kTcp: no
  // UCX, an epoll fd over the channels' sockets.
  static Result<std::shared_ptr<Context>> create(const ContextOptions& options = {});
  NetPath path() const { return path_; }
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  // ferry's TCP path: a channel's socket, watched by event_fd() (edge-triggered), and
  // `flush`, which progress() runs (it writes what the socket takes; true if it wrote).
  Result<std::uint64_t> add_stream(int fd, std::function<bool()> flush);
  void remove_stream(std::uint64_t id, int fd);

  // Becomes readable when the worker has work; after it does, call progress() and then
  // look at every channel (try_receive, Transfer::done) before arming again.
  int event_fd() const { return event_fd_; }
  // Runs UCX's progress engine until it has nothing left to do; true if it did anything.
  bool progress();
  // Runs `f` after each turn of the engine that did something, before the next turn: a
  // channel takes the stream bytes UCX received for it there, because UCX drops the bytes
  // not yet taken when it handles the peer's end, which may come on the very next turn.
  // Returns the id remove_after_turn takes.
  std::uint64_t add_after_turn(std::function<void()> f);
  void remove_after_turn(std::uint64_t id);
  // Arms event_fd for the next event. false: events are pending already; progress instead
  // of sleeping.
  bool arm();
  // One turn of net::Poller's loop with no other fds: progress(), arm(), then sleep on
  // event_fd for at most `timeout` (capped at Poller::kMaxSleep, 50 ms, so a missed wakeup
  // costs at most that). For the blocking calls of Channel and Listener.
  void wait(std::chrono::milliseconds timeout);

  // Registers (ucp_mem_map) memory the caller owns, once per session, for bulk transfers
  // from or into it. REQUIRES: the memory outlives the region.
  Result<MemoryRegion> register_memory(std::span<std::byte> memory);

  // The transports and devices UCX found, one "tl/device" per entry, e.g. "tcp/lo tcp/eth0
  // posix/memory"; for logs and `ferry doctor`.
  const std::string& resources() const { return resources_; }
  // A fresh random nonzero id no other channel of this context uses (bulk tags).
  std::uint32_t allocate_bulk_id();
  void release_bulk_id(std::uint32_t id) { bulk_ids_.erase(id); }

  // The main worker's address (ucp_worker_get_address), which a peer creates its endpoint
  // from. A listener's channels live on the main worker.
  const std::vector<std::byte>& worker_address() const { return worker_address_; }
  // A new worker on this context, progressed and polled with the main one. connect() makes
  // each channel on a worker of its own: UCX pairs the two ends of worker-address endpoints
  // by the order each worker created endpoints to the other, so two workers with exactly one
  // endpoint each way can never be paired wrongly, whatever else runs between two nodes
  // (channels opened both ways at once, a peer that died half-way through connecting).
  Result<std::shared_ptr<Worker>> add_worker();
  // Makes event_fd() readable once when `fd` becomes readable or hangs up: a channel's
  // bootstrap socket, whose end says its peer is gone. The caller keeps `fd` open.
  void watch_once(int fd);
  // Keeps a send's buffer until UCX is done with its request: the send of a channel closed
  // gracefully before its peer took it. progress() frees each once its request completes;
  // a worker's destruction frees the rest.
  void drain(ucp_worker_h worker, void* request, std::vector<std::byte> buffer);

  ucp_context_h ucp() const { return context_; }
  ucp_worker_h worker() const { return worker_; }

 private:
  struct Private {};

 public:
  explicit Context(Private) {}

 private:
  struct Draining {
    ucp_worker_h worker;
    void* request;
    std::vector<std::byte> buffer;
  };
  void reap_drained();
  // Drops `worker`'s draining sends without touching their requests: it has been destroyed.
  void forget_drained(ucp_worker_h worker);

  NetPath path_ = NetPath::kTcp;
  std::vector<std::pair<std::uint64_t, std::function<bool()>>> streams_;  // kTcp's sockets
  std::uint64_t last_stream_ = 0;
  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  int event_fd_ = -1;             // an epoll fd over every worker's event fd
  int main_event_fd_ = -1;        // the main worker's
  std::vector<Worker*> workers_;  // add_worker()'s, alive
  std::vector<std::pair<std::uint64_t, std::function<void()>>> after_turn_;
  std::uint64_t last_after_turn_ = 0;
  bool serialized_ = false;
  std::string resources_;
  std::vector<std::byte> worker_address_;
  std::unordered_set<std::uint32_t> bulk_ids_;
  std::vector<Draining> draining_;
};

// Memory registered with a Context. Move-only; deregisters on destruction.
class MemoryRegion {
 public:
  MemoryRegion() = default;
  MemoryRegion(MemoryRegion&& o) noexcept;
  MemoryRegion& operator=(MemoryRegion&& o) noexcept;
  ~MemoryRegion();

  std::byte* data() const { return data_; }
  std::size_t size() const { return size_; }
  // Whether [p, p + n) lies inside the region.
  bool contains(const void* p, std::size_t n) const;
  ucp_mem_h handle() const { return memh_; }

 private:
  friend class Context;
  void reset();
  std::shared_ptr<Context> context_;
  ucp_mem_h memh_ = nullptr;
  std::byte* data_ = nullptr;
  std::size_t size_ = 0;
};

// The "tl/device" pairs of the lanes an endpoint uses (from ucp_ep_print_info, since
// ucp_ep_query cannot say in UCX 1.13), e.g. "tcp/lo" or "rc_mlx5/mlx5_0:1 sysv/memory".
std::string endpoint_transports(ucp_ep_h ep);

}  // namespace ferry::net
