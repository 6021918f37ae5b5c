#include "tools/delta_sync_bench.h"

#include <dirent.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <linux/tcp.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <optional>

#include "base/file_util.h"
#include "base/status_macros.h"
#include "delta/training_update.h"
#include "ferry/model.h"
#include "ferry/sync.h"
#include "tools/child_process.h"
#include "tools/host_buffer.h"
#include "tools/sync_bench.h"

namespace ferry::tools {
namespace {

// This process's resident set now (VmRSS), in bytes.
std::uint64_t current_rss_bytes() {
  std::ifstream status("/proc/self/status");
  std::string key;
  while (status >> key) {
    if (key == "VmRSS:") {
      std::uint64_t kb = 0;
      status >> kb;
      return kb << 10;
    }
  }
  return 0;
}

// Bytes this process's TCP sockets have sent (TCP_INFO tcpi_bytes_sent, retransmissions
// included). Under UCX_TLS=tcp that is what the senders put on their links.
std::uint64_t tcp_bytes_sent() {
  DIR* dir = ::opendir("/proc/self/fd");
  if (dir == nullptr) return 0;
  std::uint64_t total = 0;
  while (const dirent* e = ::readdir(dir)) {
    const int fd = std::atoi(e->d_name);
    if (e->d_name[0] < '0' || e->d_name[0] > '9' || fd == ::dirfd(dir)) continue;
    tcp_info info{};
    socklen_t len = sizeof(info);
    // Other descriptors (files, pipes, Unix sockets) refuse TCP_INFO.
    if (::getsockopt(fd, IPPROTO_TCP, TCP_INFO, &info, &len) != 0) continue;
    if (len < offsetof(tcp_info, tcpi_bytes_sent) + sizeof(info.tcpi_bytes_sent)) continue;
    total += info.tcpi_bytes_sent;
  }
  ::closedir(dir);
  return total;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

std::uint64_t median(std::vector<std::uint64_t> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// A receiver process in destination mode on `address`, receiving `rounds` rounds.
Result<Subprocess> start_receiver(const std::string& address, const sync::SyncOptions& o,
                                  const std::vector<TensorSpec>& specs, std::uint64_t total,
                                  int rounds) {
  return fork_child([address, o, specs, total, rounds]() -> std::string {
    auto dst = map_anonymous(total, false, /*prefault=*/true);
    if (!dst.ok()) return "error " + dst.status().to_string();
    auto rx = sync::Receiver::connect(address, 0, o);
    if (!rx.ok()) return "error " + rx.status().to_string();
    std::uint64_t off = 0;
    for (const auto& s : specs) {
      (void)(*rx)->set_destination({s, {dst->data() + off, s.bytes()}});
      off += s.bytes();
    }
    for (int r = 0; r < rounds; ++r) {
      auto got = (*rx)->receive_round_into();
      if (!got.ok()) return "error " + got.status().to_string();
    }
    // Stay until the sender ends the session: a receiver that exits right after its last
    // ACK can be seen to close before the ACK is read.
    (void)(*rx)->receive_round_into();
    return "ok";
  });
}

// Where one session's rounds go, started before this process maps the model: a receiver
// process (shm), or a node process (net: a relay and one local receiver) that learns the
// sender's address from `address_pipe`.
struct FarEnd {
  std::optional<Subprocess> child;  // set once started
  std::string address;              // shm: the session's address; net: host:0 to listen on
  int address_pipe = -1;            // net: where the sender's address goes
};

// Net: both nodes' pipes exist before either forks, so each child closes every write end and
// sees EOF, not a hang, when this process ends before sending an address.
Result<std::array<FarEnd, 2>> start_nodes(const tools::NetBenchConfig& c) {
  FERRY_RETURN_IF_ERROR(ensure_bench_token());
  std::array<int, 2> read_ends{-1, -1};
  std::array<FarEnd, 2> ends;
  for (std::size_t i = 0; i < 2; ++i) {
    int p[2];
    if (::pipe2(p, O_CLOEXEC) != 0) return errno_status("pipe2", "bench node address", errno);
    read_ends[i] = p[0];
    ends[i].address_pipe = p[1];
    ends[i].address = fmt::format("{}:0", c.host);
  }
  for (std::size_t i = 0; i < 2; ++i) {
    auto kid = fork_child([&, i]() -> std::string {
      for (const FarEnd& e : ends) ::close(e.address_pipe);
      std::string upstream;
      char ch = 0;
      while (::read(read_ends[i], &ch, 1) == 1 && ch != '\n') upstream += ch;
      if (upstream.empty()) return "error the bench sender never started";
      auto r = run_net_bench_node(c, upstream, 1);
      return r.ok() ? "ok" : "error " + r.status().to_string();
    });
    if (!kid.ok()) return kid.status();
    ends[i].child.emplace(std::move(*kid));
  }
  for (int fd : read_ends) ::close(fd);
  return ends;
}

// The session's sender, its far end told where it listens, joined.
Result<std::unique_ptr<sync::Sender>> open_session(FarEnd& end, const sync::SyncOptions& o) {
  FERRY_ASSIGN_OR_RETURN(std::unique_ptr<sync::Sender> sender,
                         sync::Sender::create(end.address, o));
  if (end.address_pipe >= 0) {
    const std::string line = sender->address() + "\n";
    Status wrote = write_all(end.address_pipe, as_bytes(line), "bench node pipe");
    ::close(end.address_pipe);
    end.address_pipe = -1;
    FERRY_RETURN_IF_ERROR(wrote);
  }
  FERRY_RETURN_IF_ERROR(sender->accept(1));
  return sender;
}

}  // namespace

Result<std::vector<DeltaBenchResult>> run_delta_sync_bench(
    const DeltaBenchConfig& config, const std::function<void(const DeltaBenchResult&)>& on_result) {
  if (config.rounds < 1) return invalid_argument("--rounds must be 1 or more");
  for (double d : config.densities) {
    if (!(d >= 0 && d <= 1)) {
      return invalid_argument(fmt::format("--delta-density {}: give fractions in [0, 1]", d));
    }
  }
  if (config.net) {
    // Link bytes are counted on TCP sockets: other transports would carry them unseen.
    const char* tls = std::getenv("UCX_TLS");
    if (tls == nullptr) {
      if (::setenv("UCX_TLS", "tcp", 1) != 0) return errno_status("setenv", "UCX_TLS", errno);
    } else if (std::string(tls) != "tcp") {
      return invalid_argument(fmt::format(
          "--net counts the bytes of TCP sockets: run with UCX_TLS unset or tcp, not '{}'", tls));
    }
  }
  FERRY_ASSIGN_OR_RETURN(
      const std::vector<TensorSpec> specs,
      bench_specs(config.preset, config.dtype, config.tensor_count, config.tensor_bytes));
  std::uint64_t total = 0;
  for (const auto& s : specs) total += s.bytes();

  sync::SyncOptions dense_options;
  dense_options.bucket_bytes = config.bucket_mb << 20;
  dense_options.slots = config.slots;
  sync::SyncOptions delta_options = dense_options;
  if (config.delta == sync::DeltaMode::kOff) {
    return invalid_argument("--delta off: the delta session needs on or auto");
  }
  delta_options.delta = config.delta;
  const bool adam = config.adam && config.dtype == DType::kBF16;
  // The base, a delta of nothing, each density's rounds, and Adam's two (the weights before
  // it, the step).
  const int rounds = 2 + static_cast<int>(config.densities.size()) * config.rounds + (adam ? 2 : 0);
  // Far ends first, while this process is small: dense's, then delta's.
  std::array<FarEnd, 2> ends;
  if (config.net) {
    tools::NetBenchConfig node;
    node.preset = config.preset;
    node.dtype = config.dtype;
    node.bucket_mb = {config.bucket_mb};
    node.nodes = {1};
    node.receivers_per_node = 1;
    node.slots = config.slots;
    node.rounds = rounds - 1;  // a node receives rounds + 1
    node.host = config.host;
    node.tensor_count = config.tensor_count;
    node.tensor_bytes = config.tensor_bytes;
    FERRY_ASSIGN_OR_RETURN(ends, start_nodes(node));
  } else {
    ends[0].address = fmt::format("@ferry-bench-dense-{}", ::getpid());
    ends[1].address = fmt::format("@ferry-bench-delta-{}", ::getpid());
    FERRY_ASSIGN_OR_RETURN(ends[0].child,
                           start_receiver(ends[0].address, dense_options, specs, total, rounds));
    FERRY_ASSIGN_OR_RETURN(ends[1].child,
                           start_receiver(ends[1].address, delta_options, specs, total, rounds));
  }

  auto source = map_anonymous(total, true, /*prefault=*/true);
  if (!source.ok()) return source.status();
  const std::vector<TensorView> views = lay_out(specs, source->data());
  auto tensor_bytes = [&](std::size_t t) {
    return std::span<std::byte>(source->data() + (views[t].data.data() - source->data()),
                                views[t].data.size());
  };
  for (std::size_t t = 0; t < specs.size(); ++t) {
    model::fill_synthetic(1, specs[t].name, 0, tensor_bytes(t));
  }
  FERRY_ASSIGN_OR_RETURN(std::unique_ptr<sync::Sender> dense, open_session(ends[0], dense_options));
  FERRY_ASSIGN_OR_RETURN(std::unique_ptr<sync::Sender> delta, open_session(ends[1], delta_options));
  const std::uint64_t rss_before = current_rss_bytes();  // after both rings

  // Sends the source on both sessions; the round stats of each and (net) the bytes each
  // put on its link: the sessions take turns, so each count is that session's alone.
  struct Both {
    sync::RoundStats dense, delta;
    std::uint64_t dense_link = 0, delta_link = 0;
  };
  auto send_both = [&]() -> Result<Both> {
    Both both;
    const std::uint64_t at_start = config.net ? tcp_bytes_sent() : 0;
    FERRY_ASSIGN_OR_RETURN(both.dense, dense->send_round(views));
    const std::uint64_t after_dense = config.net ? tcp_bytes_sent() : 0;
    FERRY_ASSIGN_OR_RETURN(both.delta, delta->send_round(views));
    const std::uint64_t after_delta = config.net ? tcp_bytes_sent() : 0;
    both.dense_link = after_dense - at_start;
    both.delta_link = after_delta - after_dense;
    return both;
  };
  FERRY_RETURN_IF_ERROR(send_both().status());  // round 1: dense on both, the base
  FERRY_RETURN_IF_ERROR(send_both().status());  // round 2: a delta of nothing, every buffer made
  const std::uint64_t extra = current_rss_bytes() - rss_before;

  std::vector<DeltaBenchResult> results;
  // A failed round: the receivers' own words say why (they exit on the error).
  auto with_receivers = [&](Status why) -> Status {
    dense.reset();
    delta.reset();
    std::string said;
    for (FarEnd& e : ends) {
      auto out = finish_child(*e.child);
      said += "; receiver: " + (out.ok() ? *out : out.status().to_string());
    }
    return Status(why.code(), why.message() + said);
  };
  auto measure = [&](const std::string& update, double density, int times,
                     const std::function<void()>& change) -> Status {
    std::vector<double> dense_times, delta_times;
    std::vector<std::uint64_t> dense_links;
    std::vector<Both> delta_rounds;
    for (int r = 0; r < times; ++r) {
      change();
      FERRY_ASSIGN_OR_RETURN(Both both, send_both());
      dense_times.push_back(both.dense.seconds);
      delta_times.push_back(both.delta.seconds);
      dense_links.push_back(both.dense_link);
      delta_rounds.push_back(both);
    }
    DeltaBenchResult res;
    res.update = update;
    res.density = density;
    res.bytes = total;
    res.dense_seconds = median(dense_times);
    res.delta_seconds = median(delta_times);
    res.speedup = res.delta_seconds > 0 ? res.dense_seconds / res.delta_seconds : 0;
    std::sort(delta_rounds.begin(), delta_rounds.end(),
              [](const Both& a, const Both& b) { return a.delta.seconds < b.delta.seconds; });
    const Both& mid = delta_rounds[delta_rounds.size() / 2];
    res.went_delta = mid.delta.delta;
    res.wire_bytes = mid.delta.wire_bytes;
    res.wire_ratio = res.wire_bytes > 0 ? static_cast<double>(total) / res.wire_bytes : 0;
    res.sender_extra_bytes = extra;
    if (config.net) {
      res.dense_link_bytes = median(dense_links);
      res.delta_link_bytes = mid.delta_link;
      res.link_ratio = res.delta_link_bytes > 0 ? static_cast<double>(res.dense_link_bytes) /
                                                      static_cast<double>(res.delta_link_bytes)
                                                : 0;
    }
    results.push_back(res);
    if (on_result) on_result(res);
    return ok_status();
  };
  std::uint64_t seed = 100;
  for (double d : config.densities) {
    Status measured = measure(fmt::format("density {}", d), d, config.rounds, [&] {
      for (std::size_t t = 0; t < specs.size(); ++t) {
        const int bits = dtype_bits(specs[t].dtype);
        delta::change_elements(++seed, d, static_cast<std::size_t>(std::max(bits / 8, 1)),
                               tensor_bytes(t));
      }
    });
    if (!measured.ok()) return with_receivers(measured);
  }
  if (adam) {
    // One Adam step: publish the weights before it (untimed), then time the step itself.
    constexpr double kLr = 1e-6;
    auto after = map_anonymous(total, true, /*prefault=*/true);
    if (!after.ok()) return after.status();
    double changed = 0;
    for (std::size_t t = 0; t < specs.size(); ++t) {
      const std::span<std::byte> now = tensor_bytes(t);
      const std::span<std::byte> next(after->data() + (now.data() - source->data()), now.size());
      changed += delta::adam_step_bf16(++seed, kLr, now, next) * static_cast<double>(now.size());
    }
    Status measured = send_both().status();
    // One step, once: a second round would resend it unchanged.
    if (measured.ok()) {
      measured = measure(fmt::format("adam lr {}", kLr), changed / static_cast<double>(total), 1,
                         [&] { std::memcpy(source->data(), after->data(), total); });
    }
    if (!measured.ok()) return with_receivers(measured);
  }
  dense.reset();  // the far ends see their sessions end
  delta.reset();
  for (FarEnd& e : ends) {
    Result<std::string> out = finish_child(*e.child);
    if (!out.ok()) return out.status();
    if (out->rfind("ok", 0) != 0) return aborted("bench receiver: " + *out);
  }
  return results;
}

}  // namespace ferry::tools
