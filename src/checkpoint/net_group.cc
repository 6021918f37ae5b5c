// RankGroup across machines over the UCX net transport (docs/checkpoint.md).
//
// A net::Context and everything made from it are used by one thread at a time, so each
// rank has two:
// - the calling side (`calls_`): the channels of the collectives (a star through rank 0,
//   as in the local group) and the channels of this rank's fetches to the others. Callers'
//   threads take turns on it under call_mu_ (a SERIALIZED UCX worker).
// - the serving side (`serve_`): owned by one thread that accepts the others' fetch
//   channels, answers each request with the installed handler and sends the answer as one
//   UCX bulk transfer straight from the handler's memory. It never waits on a caller, so a
//   rank keeps answering while it sits in a collective.
// Every channel is authenticated with the session token before it carries a byte.
#include <poll.h>

#include <atomic>
#include <chrono>
#include <list>
#include <map>
#include <mutex>
#include <optional>
#include <thread>

#include "base/clock.h"
#include "base/log.h"
#include "checkpoint/group_base.h"
#include "transport/net/channel.h"
#include "base/coding.h"

namespace ferry::checkpoint {
namespace {

using std::chrono::milliseconds;

// The group's messages, each one whole net control message that starts with its kind.
// Integers little-endian; a string is a u32 length and its bytes.
enum class Kind : std::uint8_t {
  kJoin = 1,        // rank -> 0: u16 version, u32 rank, u32 size, node, serve address
  kTable = 2,       // 0 -> rank: u32 size, then per rank: node, fetch address
  kPart = 3,        // rank -> 0: a chunk of this rank's part of a collective (blob, below)
  kResult = 4,      // 0 -> rank: a chunk of the collective's result (blob)
  kAbort = 5,       // 0 -> rank: u8 code, message: the group failed; the message names who
  kFetchHello = 6,  // fetcher -> server, first: u16 version, u32 rank
  kFetch = 7,       // u32 id, u64 expected size (kAnySize: any), the request's bytes
  kAnswer = 8,      // u32 id, u8 code, u64 size, the error message (code != 0);
                    // then, when OK and size > 0, one bulk message of `size` bytes, key id
};
constexpr std::uint16_t kVersion = 1;
constexpr std::uint64_t kAnySize = ~std::uint64_t{0};
// A blob (a part or a result of any size) travels as chunks: kind, u64 collective number,
// u64 total size, then up to max_message_bytes() - kBlobHeader of its bytes.
constexpr std::size_t kBlobHeader = 1 + 8 + 8;
// The most refused joiners a join error lists.
constexpr std::size_t kMaxRefusals = 8;
// No part, result or fetch answer of a checkpoint is near this; a peer that announces more
// is not believed (nothing is allocated for it).
constexpr std::uint64_t kMaxBytes = 16ull << 30;

// After progress() and a look at every channel: sleeps until the worker has news, at most
// `left` and 50 ms (so a missed wakeup costs little).
void idle(net::Context& ctx, milliseconds left) {
  if (!ctx.arm()) return;  // events pending already
  pollfd p{ctx.event_fd(), POLLIN, 0};
  (void)::poll(&p, 1, static_cast<int>(std::min<long long>(left.count(), 50)));
}

std::vector<std::byte> message(Kind kind) {
  std::vector<std::byte> m;
  coding::put_u8(&m, static_cast<std::uint8_t>(kind));
  return m;
}
void put_str(std::vector<std::byte>* out, std::string_view s) {
  coding::put_u32(out, static_cast<std::uint32_t>(s.size()));
  coding::put_bytes(out, s);
}
std::string get_str(coding::Reader& in) {
  const std::uint32_t n = in.u32();
  return in.bytes(n);
}
std::string_view as_text(std::span<const std::byte> b) {
  return {reinterpret_cast<const char*>(b.data()), b.size()};
}

// A Status code read from the wire; nullopt for one this build does not know.
std::optional<Code> code_from_wire(std::uint8_t c) {
  if (c > static_cast<std::uint8_t>(Code::kInternal)) return std::nullopt;
  return static_cast<Code>(c);
}

// "host:port" -> host ("[::1]" keeps its brackets); "" when there is no port.
std::string host_of(const std::string& host_port) {
  const auto colon = host_port.rfind(':');
  return colon == std::string::npos ? std::string() : host_port.substr(0, colon);
}
std::string port_of(const std::string& host_port) {
  const auto colon = host_port.rfind(':');
  return colon == std::string::npos ? std::string() : host_port.substr(colon + 1);
}
bool wildcard_host(const std::string& host) { return host == "0.0.0.0" || host == "[::]"; }

// Reassembles one blob from its chunks.
struct Blob {
  bool started = false;
  std::uint64_t total = 0;
  std::string data;
  bool complete() const { return started && data.size() == total; }

  Status feed(std::span<const std::byte> m, Kind kind, std::uint64_t seq, const std::string& who) {
    coding::Reader in(m);
    const auto k = static_cast<Kind>(in.u8());
    const std::uint64_t s = in.u64(), total_now = in.u64();
    if (!in.ok() || k != kind) return corruption("malformed collective message from " + who);
    if (s != seq) {
      return corruption(who + " is at collective #" + std::to_string(s) +
                        " while this rank is at #" + std::to_string(seq) +
                        " (every rank must call the collectives in the same order)");
    }
    if (started && total_now != total) {
      return corruption("inconsistent collective message from " + who);
    }
    if (!started) {
      if (total_now > kMaxBytes) {
        return corruption(who + " announced a collective part of " + std::to_string(total_now) +
                          " bytes");
      }
      started = true;
      total = total_now;
      data.reserve(total);
    }
    if (in.remaining() > total - data.size()) {
      return corruption("oversized collective message from " + who);
    }
    data += in.bytes(in.remaining());
    return ok_status();
  }
};

Status send_blob(net::Channel& ch, Kind kind, std::uint64_t seq, std::string_view data,
                 const Deadline& dl) {
  const std::size_t chunk = net::max_message_bytes() - kBlobHeader;
  std::size_t at = 0;
  do {
    const std::size_t n = std::min(chunk, data.size() - at);
    std::vector<std::byte> m = message(kind);
    coding::put_u64(&m, seq);
    coding::put_u64(&m, data.size());
    coding::put_bytes(&m, data.substr(at, n));
    if (Status s = ch.send(m, dl.left()); !s.ok()) return s;
    at += n;
  } while (at < data.size());
  return ok_status();
}

std::string encode_parts(const std::vector<std::string>& parts) {
  std::vector<std::byte> out;
  coding::put_u32(&out, static_cast<std::uint32_t>(parts.size()));
  for (const std::string& p : parts) {
    coding::put_u64(&out, p.size());
    coding::put_bytes(&out, p);
  }
  return std::string(as_text(out));
}

// One answer being sent: the bulk transfer, the registration of its bytes and what keeps
// those bytes alive. Members are destroyed bottom-up: the transfer first.
struct Outgoing {
  RankGroup::FetchReply reply;
  std::vector<std::byte> copy;  // when the reply's own memory could not be registered
  net::MemoryRegion region;
  net::Transfer transfer;
};

struct ServeConn {
  net::Channel ch;
  int from = -1;  // the peer's rank, once it said hello
  std::list<Outgoing> sending;
};

struct FetchConn {
  net::Channel ch;
  std::uint32_t next_id = 0;
};

class NetGroup final : public GroupBase {
 public:
  explicit NetGroup(const NetGroupOptions& o) : GroupBase(o.rank, o.size, o.node), opts_(o) {}

  ~NetGroup() override {
    stop_.store(true);
    if (server_.joinable()) server_.join();
    std::lock_guard<std::mutex> lock(call_mu_);
    // No fetch is in flight (they hold call_mu_): nothing to flush.
    for (auto& [peer, conn] : fetch_conns_) conn.ch.abort();
    // Closed, not aborted: the last collective's result may still be on its way.
    root_.close();
    for (net::Channel& p : peers_) p.close();
  }

  Status start() {
    if (Status s = check_membership(); !s.ok()) return s;
    auto token = opts_.token.empty()
                     ? net::Token::from_env()
                     : net::Token::from_string(opts_.token, "NetGroupOptions::token");
    if (!token.ok()) {
      return token.status().with_context(
          "rank " + std::to_string(rank()) +
          " has no session token for the checkpoint group (set "
          "NetGroupOptions::token, FERRY_TOKEN or FERRY_TOKEN_FILE)");
    }
    token_.emplace(std::move(*token));
    // Collectives and fetches reach calls_ from the callers' threads (load() fetches on a
    // thread of its own), one at a time under call_mu_.
    auto calls = net::Context::create({.serialized = true});
    if (!calls.ok()) return calls.status();
    calls_ = std::move(*calls);
    auto serve = net::Context::create();
    if (!serve.ok()) return serve.status();
    serve_ = std::move(*serve);
    auto listener = net::Listener::bind(serve_, opts_.serve_address, *token_);
    if (!listener.ok()) {
      return listener.status().with_context("rank " + std::to_string(rank()) + " serving fetches");
    }
    listener_ = std::move(*listener);
    const std::string serving = listener_.address();
    // The serving thread reads none of these.
    nodes_.assign(size(), "");
    addresses_.assign(size(), "");
    nodes_[rank()] = node();
    server_ = std::thread([this] { serve_loop(); });

    const Deadline dl(opts_.timeout);
    Status s = rank() == 0 ? gather_members(serving, dl) : join(serving, dl);
    if (s.ok()) {
      log::debug("checkpoint group: rank {} of {} joined at {}", rank(), size(),
                 opts_.root_address);
    }
    return s;
  }

  Result<std::vector<std::string>> all_gather(std::string_view mine) override {
    std::lock_guard<std::mutex> lock(call_mu_);
    if (!broken_.ok()) return broken_;
    const std::uint64_t seq = ++seq_;
    auto r = rank() == 0 ? gather_at_root(mine, seq) : gather_at_member(mine, seq);
    if (!r.ok()) {
      broken_ = r.status();
      if (rank() == 0) tell_members(broken_);
    }
    return r;
  }

 private:
  // ---- joining ----

  // Rank 0: accepts every other rank on the root address, then sends every rank the member table.
  Status gather_members(const std::string& serving, const Deadline& dl) {
    addresses_[0] = wildcard_host(host_of(serving))
                        ? host_of(opts_.root_address) + ":" + port_of(serving)
                        : serving;
    if (size() == 1) return ok_status();
    // The listener logs and skips peers that fail the handshake; their reasons are kept
    // for the join's timeout error.
    auto refused_ptr = std::make_shared<std::vector<std::string>>();
    net::ListenerOptions lo;
    lo.on_refused = [refused_ptr](const Status& why) {
      if (refused_ptr->size() < kMaxRefusals) refused_ptr->push_back(why.message());
    };
    auto listener = net::Listener::bind(calls_, opts_.root_address, *token_, lo);
    if (!listener.ok()) return listener.status().with_context("rank 0 listening for the group");
    peers_.resize(size());
    std::vector<std::string>& refused = *refused_ptr;
    for (int joined = 1; joined < size();) {
      auto ch = listener->accept(dl.left());
      if (!ch.ok()) {
        if (dl.passed()) return join_timeout(refused);
        // A peer that failed the handshake: keep waiting for the real rank, so that a
        // stranger cannot break the join; its refusal is listed if the join times out.
        const bool refusal = ch.status().code() != Code::kTimeout;  // not just "nobody yet"
        if (refusal && refused.size() < kMaxRefusals) refused.push_back(ch.status().message());
        continue;
      }
      auto hello = ch->receive(dl.left());
      if (!hello.ok()) {
        if (refused.size() < kMaxRefusals) refused.push_back(hello.status().message());
        continue;
      }
      coding::Reader in(*hello);
      const auto kind = static_cast<Kind>(in.u8());
      const std::uint16_t version = in.u16();
      const std::uint32_t r = in.u32(), n = in.u32();
      std::string node = get_str(in), address = get_str(in);
      Status bad;
      if (!in.ok() || kind != Kind::kJoin) {
        bad = corruption("malformed join message from " + ch->peer());
      } else if (version != kVersion) {
        bad = failed_precondition(ch->peer() + " speaks checkpoint group protocol version " +
                                  std::to_string(version) + ", rank 0 version " +
                                  std::to_string(kVersion));
      } else if (n != static_cast<std::uint32_t>(size())) {
        bad = invalid_argument("rank " + std::to_string(r) + " (" + ch->peer() +
                               ") joined a group of " + std::to_string(n) +
                               " ranks, rank 0 one of " + std::to_string(size()));
      } else if (r == 0 || r >= n || peers_[r].valid()) {
        bad = invalid_argument("rank " + std::to_string(r) + " (" + ch->peer() + ") joined " +
                               opts_.root_address + " twice or is outside the group of " +
                               std::to_string(size()));
      } else if (Status v = format::validate_node_name(node); !v.ok()) {
        bad = v;
      } else if (wildcard_host(host_of(address))) {
        // Advertised as where its connection came from: the peer is "peer 10.0.0.2:40123".
        const std::string from = host_of(ch->peer());
        if (from.rfind("peer ", 0) == 0 && from.size() > 5) {
          address = from.substr(5) + ":" + port_of(address);
        } else {
          bad = failed_precondition("rank 0 cannot tell the address of rank " + std::to_string(r) +
                                    " (" + ch->peer() + "); give it a serve_address with a host");
        }
      }
      if (!bad.ok()) {
        send_abort(*ch, bad);
        tell_members(bad);
        return bad;
      }
      nodes_[r] = std::move(node);
      addresses_[r] = std::move(address);
      peers_[r] = std::move(*ch);
      ++joined;
    }
    std::vector<std::byte> table = message(Kind::kTable);
    coding::put_u32(&table, static_cast<std::uint32_t>(size()));
    for (int r = 0; r < size(); ++r) {
      put_str(&table, nodes_[r]);
      put_str(&table, addresses_[r]);
    }
    for (int r = 1; r < size(); ++r) {
      if (Status s = peers_[r].send(table, dl.left()); !s.ok()) {
        Status failed = s.with_context(peer_name(r));
        tell_members(failed);
        return failed;
      }
    }
    return ok_status();
  }

  Status join_timeout(const std::vector<std::string>& refused) const {
    std::string missing;
    for (int r = 1; r < size(); ++r) {
      if (!peers_[r].valid()) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
    }
    std::string msg = "rank 0 waited " + std::to_string(opts_.timeout.count()) + " ms on " +
                      opts_.root_address + " but rank(s) " + missing + " did not join";
    if (refused.empty()) return timeout_error(msg);
    msg += "; refused: ";
    for (std::size_t i = 0; i < refused.size(); ++i) msg += (i ? "; " : "") + refused[i];
    return unauthenticated(msg);
  }

  // Ranks > 0: connects to rank 0, says who it is, and gets the member table.
  Status join(const std::string& serving, const Deadline& dl) {
    const std::string what =
        "rank " + std::to_string(rank()) + " joining the group at " + opts_.root_address;
    auto ch = net::connect(calls_, opts_.root_address, *token_, dl.left(),
                           {.role = "rank 0 (the group's root)"});
    if (!ch.ok()) return ch.status().with_context(what);
    root_ = std::move(*ch);
    std::vector<std::byte> hello = message(Kind::kJoin);
    coding::put_u16(&hello, kVersion);
    coding::put_u32(&hello, static_cast<std::uint32_t>(rank()));
    coding::put_u32(&hello, static_cast<std::uint32_t>(size()));
    put_str(&hello, node());
    put_str(&hello, serving);
    if (Status s = root_.send(hello, dl.left()); !s.ok()) return s.with_context(what);
    auto table = root_.receive(dl.left());
    if (!table.ok()) return table.status().with_context(what);
    coding::Reader in(*table);
    const auto kind = static_cast<Kind>(in.u8());
    if (kind == Kind::kAbort) return read_abort(in).with_context(what);
    const std::uint32_t n = in.u32();
    if (kind != Kind::kTable || n != static_cast<std::uint32_t>(size())) {
      return corruption(what + ": malformed member table from rank 0");
    }
    for (int r = 0; r < size(); ++r) {
      nodes_[r] = get_str(in);
      addresses_[r] = get_str(in);
    }
    if (!in.ok()) return corruption(what + ": malformed member table from rank 0");
    return ok_status();
  }

  // ---- collectives ----

  Result<std::vector<std::string>> gather_at_root(std::string_view mine, std::uint64_t seq) {
    const Deadline dl(opts_.collective_timeout);
    std::vector<std::string> all(size());
    all[0] = std::string(mine);
    std::vector<Blob> parts(size());
    int missing = size() - 1;
    while (missing > 0) {
      calls_->progress();
      bool any = false;
      for (int r = 1; r < size(); ++r) {
        while (!parts[r].complete()) {
          auto m = peers_[r].try_receive();
          if (!m.ok()) return m.status().with_context(peer_name(r));
          if (!m->has_value()) break;
          any = true;
          if (Status s = parts[r].feed(**m, Kind::kPart, seq, peer_name(r)); !s.ok()) return s;
          if (parts[r].complete()) {
            all[r] = std::move(parts[r].data);
            --missing;
          }
        }
      }
      if (missing == 0) break;
      if (dl.passed()) {
        std::string late;
        for (int r = 1; r < size(); ++r) {
          if (!parts[r].complete()) late += (late.empty() ? "" : ", ") + peer_name(r);
        }
        return timeout_error(late + " did not reach collective #" + std::to_string(seq) +
                             " within " + std::to_string(opts_.collective_timeout.count()) + " ms");
      }
      if (!any) idle(*calls_, dl.left());
    }
    const std::string result = encode_parts(all);
    for (int r = 1; r < size(); ++r) {
      if (Status s = send_blob(peers_[r], Kind::kResult, seq, result, dl); !s.ok()) {
        return s.with_context(peer_name(r));
      }
    }
    return all;
  }

  Result<std::vector<std::string>> gather_at_member(std::string_view mine, std::uint64_t seq) {
    // Longer than rank 0's wait, so that when another rank is late, rank 0's error naming
    // it arrives here before this rank's own timeout.
    const auto grace = std::min<milliseconds>(opts_.collective_timeout, milliseconds(5000));
    const Deadline dl(opts_.collective_timeout + grace);
    if (Status s = send_blob(root_, Kind::kPart, seq, mine, dl); !s.ok()) return s;
    Blob result;
    while (!result.complete()) {
      auto m = root_.receive(dl.left());
      if (!m.ok()) return m.status();
      coding::Reader in(*m);
      if (static_cast<Kind>(in.u8()) == Kind::kAbort) return read_abort(in);
      if (Status s = result.feed(*m, Kind::kResult, seq, peer_name(0)); !s.ok()) return s;
    }
    coding::Reader in(std::as_bytes(std::span(result.data)));
    if (in.u32() != static_cast<std::uint32_t>(size()) || !in.ok()) {
      return corruption("malformed collective result from " + peer_name(0));
    }
    std::vector<std::string> all(size());
    for (std::string& part : all) part = in.bytes(in.u64());
    if (!in.ok() || in.remaining() != 0) {
      return corruption("malformed collective result from " + peer_name(0));
    }
    return all;
  }

  static void send_abort(net::Channel& ch, const Status& why) {
    std::vector<std::byte> m = message(Kind::kAbort);
    coding::put_u8(&m, static_cast<std::uint8_t>(why.code()));
    put_str(&m, why.message());
    (void)ch.send(m, milliseconds(1000));
  }

  Status read_abort(coding::Reader& in) const {
    const std::uint8_t code = in.u8();
    std::string msg = get_str(in);
    const auto c = code_from_wire(code);
    if (!in.ok() || !c || *c == Code::kOk) {
      return corruption("malformed abort message from " + peer_name(0));
    }
    return Status(*c, msg + " (reported by rank 0)");
  }

  // Rank 0: tells every member that the group failed and why, so that none of them waits
  // for its own timeout. A member reads it in its current or next collective.
  void tell_members(const Status& why) {
    for (net::Channel& p : peers_) {
      if (p.valid() && p.health().ok()) send_abort(p, why);
    }
  }

  // ---- fetches (caller side) ----

  Status fetch_impl(int peer, std::string_view request, std::span<std::byte>* into,
                    std::string* text) override {
    std::lock_guard<std::mutex> lock(call_mu_);
    const Deadline dl(opts_.timeout);
    FetchConn& conn = fetch_conns_[peer];
    if (!conn.ch.valid()) {
      auto ch =
          net::connect(calls_, addresses_[peer], *token_, dl.left(), {.role = peer_name(peer)});
      if (!ch.ok()) return ch.status();
      std::vector<std::byte> hello = message(Kind::kFetchHello);
      coding::put_u16(&hello, kVersion);
      coding::put_u32(&hello, static_cast<std::uint32_t>(rank()));
      if (Status s = ch->send(hello, dl.left()); !s.ok()) return s;
      conn.ch = std::move(*ch);
    }
    bool out_of_step = false;
    Status s = exchange(conn, peer, request, into, text, dl, &out_of_step);
    if (out_of_step) {
      conn.ch.abort();  // the channel may hold half an answer: start afresh next time
      fetch_conns_.erase(peer);
    }
    return s;
  }

  // One request and its answer on `conn`. *out_of_step: the channel failed or may hold
  // the rest of an answer, so it must not be used again.
  Status exchange(FetchConn& conn, int peer, std::string_view request, std::span<std::byte>* into,
                  std::string* text, const Deadline& dl, bool* out_of_step) {
    const std::uint32_t id = ++conn.next_id;
    std::vector<std::byte> m = message(Kind::kFetch);
    coding::put_u32(&m, id);
    coding::put_u64(&m, into != nullptr ? into->size() : kAnySize);
    coding::put_bytes(&m, request);
    if (m.size() > net::max_message_bytes()) {
      return invalid_argument("a fetch request of " + std::to_string(request.size()) +
                              " bytes is over the limit of " +
                              std::to_string(net::max_message_bytes()));
    }
    *out_of_step = true;
    if (Status s = conn.ch.send(m, dl.left()); !s.ok()) return s;
    auto reply = conn.ch.receive(dl.left());
    if (!reply.ok()) return reply.status();
    coding::Reader in(*reply);
    const auto kind = static_cast<Kind>(in.u8());
    const std::uint32_t got_id = in.u32();
    const std::uint8_t code = in.u8();
    const std::uint64_t bytes = in.u64();
    const std::string error = in.bytes(in.remaining());
    const auto c = code_from_wire(code);
    if (!in.ok() || kind != Kind::kAnswer || got_id != id || !c) {
      return corruption("malformed fetch answer from " + peer_name(peer));
    }
    if (*c != Code::kOk) {
      *out_of_step = false;  // no bulk message follows an error
      return Status(*c, error);
    }
    if (bytes > kMaxBytes) {
      return corruption(peer_name(peer) + " announced an answer of " + std::to_string(bytes) +
                        " bytes");
    }
    if (into != nullptr && bytes != into->size()) {
      return corruption(peer_name(peer) + " answered " + std::to_string(bytes) +
                        " bytes, expected " + std::to_string(into->size()));
    }
    *out_of_step = false;
    if (bytes == 0) return ok_status();
    *out_of_step = true;
    std::span<std::byte> dst;
    if (into != nullptr) {
      dst = *into;
    } else {
      text->resize(bytes);
      dst = std::as_writable_bytes(std::span(*text));
    }
    auto region = calls_->register_memory(dst);
    if (!region.ok()) return region.status().with_context("fetching from " + peer_name(peer));
    auto t = conn.ch.receive_bulk(id, dst, *region);
    if (!t.ok()) return t.status();
    if (Status s = conn.ch.wait(*t, dl.left()); !s.ok()) return s;
    if (t->bytes() != bytes) {
      return corruption(peer_name(peer) + " sent " + std::to_string(t->bytes()) + " of the " +
                        std::to_string(bytes) + " bytes it announced");
    }
    *out_of_step = false;
    return ok_status();
  }

  // ---- fetches (serving side, on server_) ----

  void serve_loop() {
    std::list<ServeConn> conns;
    while (!stop_.load()) {
      serve_->progress();
      bool busy = false;
      auto ch = listener_.accept(milliseconds(0));
      if (ch.ok()) {
        conns.push_back({std::move(*ch), -1, {}});
        busy = true;
      } else if (ch.status().code() != Code::kTimeout) {
        busy = true;  // refused (the listener logged it); there may be more waiting
      }
      for (auto it = conns.begin(); it != conns.end();) {
        ServeConn& c = *it;
        c.sending.remove_if([](Outgoing& o) {
          if (!o.transfer.done()) return false;
          if (!o.transfer.status().ok()) {
            log::debug("checkpoint group: {}", o.transfer.status().to_string());
          }
          return true;
        });
        bool gone = false;
        while (true) {
          auto m = c.ch.try_receive();
          if (!m.ok()) {
            gone = true;  // the fetcher closed or died; it knows
            break;
          }
          if (!m->has_value()) break;
          busy = true;
          if (Status s = serve_one(c, **m); !s.ok()) {
            log::warn("checkpoint group: rank {} drops a fetch channel: {}", rank(), s.to_string());
            gone = true;
            break;
          }
        }
        if (gone) {
          c.ch.abort();
          it = conns.erase(it);
        } else {
          ++it;
        }
      }
      if (!busy) idle(*serve_, milliseconds(50));
    }
    for (ServeConn& c : conns) c.ch.abort();
    conns.clear();
    listener_ = net::Listener();
  }

  // Handles one message on a serving channel; an error drops the channel.
  Status serve_one(ServeConn& c, std::span<const std::byte> m) {
    coding::Reader in(m);
    const auto kind = static_cast<Kind>(in.u8());
    if (kind == Kind::kFetchHello) {
      const std::uint16_t version = in.u16();
      const std::uint32_t from = in.u32();
      if (!in.ok() || version != kVersion || from >= static_cast<std::uint32_t>(size())) {
        return corruption("bad fetch hello from " + c.ch.peer());
      }
      c.from = static_cast<int>(from);
      return ok_status();
    }
    const std::uint32_t id = in.u32();
    const std::uint64_t expected = in.u64();
    if (!in.ok() || kind != Kind::kFetch || c.from < 0) {
      return corruption("malformed fetch request from " + c.ch.peer());
    }
    const std::string request = in.bytes(in.remaining());
    // In place from the start: the bytes of a short `owned` string move with it.
    Outgoing& out = c.sending.emplace_back();
    Status s = send_answer(c, id, expected, request, out);
    // Nothing in flight (an error answer, or sent already): nothing to keep.
    if (s.ok() && out.transfer.done() && out.transfer.status().ok()) c.sending.pop_back();
    return s;
  }

  // Answers request `id` into `out`: the answer message, then the bulk transfer.
  Status send_answer(ServeConn& c, std::uint32_t id, std::uint64_t expected,
                     const std::string& request, Outgoing& out) {
    Result<FetchReply> reply = answer(c.from, request);
    Status s = reply.status();
    if (s.ok()) {
      out.reply = std::move(*reply);
      const std::uint64_t n = out.reply.bytes().size();
      if (expected != kAnySize && n != expected) {
        s = corruption("rank " + std::to_string(rank()) + " (node " + node() + ") answered " +
                       std::to_string(n) + " bytes, expected " + std::to_string(expected));
      }
    }
    std::vector<std::byte> head = message(Kind::kAnswer);
    coding::put_u32(&head, id);
    coding::put_u8(&head, static_cast<std::uint8_t>(s.code()));
    coding::put_u64(&head, s.ok() ? out.reply.bytes().size() : 0);
    coding::put_bytes(&head, s.message());
    if (head.size() > net::max_message_bytes()) head.resize(net::max_message_bytes());
    if (Status sent = c.ch.send(head, opts_.timeout); !sent.ok()) return sent;
    if (!s.ok() || out.reply.bytes().empty()) return ok_status();

    // Straight from the handler's memory (a mapped shard) when UCX can register it; UCX
    // only reads a send buffer. Otherwise from a copy.
    std::span<const std::byte> bytes = out.reply.bytes();
    auto region = serve_->register_memory({const_cast<std::byte*>(bytes.data()), bytes.size()});
    if (!region.ok()) {
      out.copy.assign(bytes.begin(), bytes.end());
      bytes = out.copy;
      region = serve_->register_memory(out.copy);
      if (!region.ok()) return region.status();
    }
    out.region = std::move(*region);
    auto t = c.ch.send_bulk(id, bytes, out.region);
    if (!t.ok()) return t.status();
    out.transfer = std::move(*t);
    return ok_status();
  }

  const NetGroupOptions opts_;
  std::optional<net::Token> token_;
  std::vector<std::string> addresses_;  // where each rank serves fetches

  std::mutex call_mu_;  // the calling side: calls_ and everything made from it
  std::shared_ptr<net::Context> calls_;
  net::Channel root_;                // ranks > 0: to rank 0
  std::vector<net::Channel> peers_;  // rank 0: to each rank
  std::map<int, FetchConn> fetch_conns_;
  std::uint64_t seq_ = 0;
  Status broken_;

  std::shared_ptr<net::Context> serve_;  // the serving side: server_ alone uses it
  net::Listener listener_;
  std::thread server_;
  std::atomic<bool> stop_{false};
};

}  // namespace

Result<std::unique_ptr<RankGroup>> connect_net_group(const NetGroupOptions& options) {
  auto g = std::make_unique<NetGroup>(options);
  if (Status s = g->start(); !s.ok()) return s;
  return std::unique_ptr<RankGroup>(std::move(g));
}

}  // namespace ferry::checkpoint
