// RankGroup across machines over the UCX net transport (docs/checkpoint.md; its messages:
// docs/protocol.md, "Rank groups", and rank_group/messages.h).
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
#include <optional>
#include <thread>

#include "base/clock.h"
#include "base/log.h"
#include "base/mutex.h"
#include "base/status_macros.h"
#include "rank_group/constants.h"
#include "rank_group/group_base.h"
#include "rank_group/messages.h"
#include "transport/net/channel.h"
#include "transport/net/poller.h"

namespace ferry::rank_group {
namespace {

using checkpoint::NetGroupOptions;
using msg::Kind;
using std::chrono::milliseconds;

// After progress() and a look at every channel: sleeps until the worker has news, at most
// `left` and the Poller's cap (so a missed wakeup costs little). A failed poll() only ends
// the sleep early: the caller's deadline still bounds the loop.
void idle(net::Context& ctx, milliseconds left) {
  std::vector<pollfd> no_fds;
  (void)net::Poller(&ctx).wait(no_fds, std::min(left, kIdleWait));
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

Status send_blob(net::Channel& ch, Kind kind, std::uint64_t seq, std::string_view data,
                 const Deadline& dl) {
  const std::size_t chunk = msg::kBlobChunkBytes;
  std::size_t at = 0;
  do {
    const std::size_t n = std::min(chunk, data.size() - at);
    const std::vector<std::byte> m =
        msg::encode_blob_chunk(kind, seq, data.size(), data.substr(at, n));
    FERRY_RETURN_IF_ERROR(ch.send(m, dl.left()));
    at += n;
  } while (at < data.size());
  return ok_status();
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
    MutexLock lock(call_mu_);
    // No fetch is in flight (they hold call_mu_): nothing to flush.
    for (auto& [peer, conn] : fetch_conns_) conn.ch.abort();
    // Closed, not aborted: the last collective's result may still be on its way.
    root_.close();
    for (net::Channel& p : peers_) p.close();
  }

  Status start() {
    // Nothing else runs yet: held so that the joining, which uses the calling side, is
    // checked like every later call.
    MutexLock lock(call_mu_);
    FERRY_RETURN_IF_ERROR(check_membership());
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
    MutexLock lock(call_mu_);
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
  Status gather_members(const std::string& serving, const Deadline& dl) FERRY_REQUIRES(call_mu_) {
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
      auto join = msg::decode_join(*hello);
      std::string address = join.ok() ? join->address : std::string();
      const std::uint32_t r = join.ok() ? join->rank : 0;
      Status bad;
      if (!join.ok()) {
        bad = join.status().with_context(ch->peer());
      } else if (Status c = check_join(*join, "rank " + std::to_string(r) + " (" + ch->peer() + ")",
                                       opts_.root_address, r < peers_.size() && peers_[r].valid());
                 !c.ok()) {
        bad = c;
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
      nodes_[r] = std::move(join->node);
      addresses_[r] = std::move(address);
      peers_[r] = std::move(*ch);
      ++joined;
    }
    const std::vector<std::byte> table = msg::encode_table({nodes_, addresses_});
    for (int r = 1; r < size(); ++r) {
      if (Status s = peers_[r].send(table, dl.left()); !s.ok()) {
        Status failed = s.with_context(peer_name(r));
        tell_members(failed);
        return failed;
      }
    }
    return ok_status();
  }

  Status join_timeout(const std::vector<std::string>& refused) const FERRY_REQUIRES(call_mu_) {
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
  Status join(const std::string& serving, const Deadline& dl) FERRY_REQUIRES(call_mu_) {
    const std::string what =
        "rank " + std::to_string(rank()) + " joining the group at " + opts_.root_address;
    auto ch = net::connect(calls_, opts_.root_address, *token_, dl.left(),
                           {.role = "rank 0 (the group's root)"});
    if (!ch.ok()) return ch.status().with_context(what);
    root_ = std::move(*ch);
    const std::vector<std::byte> hello =
        msg::encode_join({kVersion, static_cast<std::uint32_t>(rank()),
                          static_cast<std::uint32_t>(size()), node(), serving});
    if (Status s = root_.send(hello, dl.left()); !s.ok()) return s.with_context(what);
    auto table = root_.receive(dl.left());
    if (!table.ok()) return table.status().with_context(what);
    if (msg::kind_of(*table) == static_cast<std::uint8_t>(Kind::kAbort)) {
      return read_abort(*table).with_context(what);
    }
    auto members = msg::decode_table(*table, static_cast<std::uint32_t>(size()));
    if (!members.ok()) return members.status().with_context(what + ": rank 0");
    nodes_ = std::move(members->nodes);
    addresses_ = std::move(members->addresses);
    return ok_status();
  }

  // ---- collectives ----

  Result<std::vector<std::string>> gather_at_root(std::string_view mine, std::uint64_t seq)
      FERRY_REQUIRES(call_mu_) {
    const Deadline dl(opts_.collective_timeout);
    std::vector<std::string> all(size());
    all[0] = std::string(mine);
    std::vector<msg::Blob> parts(size());
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
          FERRY_RETURN_IF_ERROR(parts[r].feed(**m, Kind::kPart, seq, peer_name(r)));
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
    const std::string result = msg::encode_parts(all);
    for (int r = 1; r < size(); ++r) {
      if (Status s = send_blob(peers_[r], Kind::kResult, seq, result, dl); !s.ok()) {
        return s.with_context(peer_name(r));
      }
    }
    return all;
  }

  Result<std::vector<std::string>> gather_at_member(std::string_view mine, std::uint64_t seq)
      FERRY_REQUIRES(call_mu_) {
    // Longer than rank 0's wait, so that when another rank is late, rank 0's error naming
    // it arrives here before this rank's own timeout.
    const auto grace = std::min<milliseconds>(opts_.collective_timeout, kMemberGrace);
    const Deadline dl(opts_.collective_timeout + grace);
    FERRY_RETURN_IF_ERROR(send_blob(root_, Kind::kPart, seq, mine, dl));
    msg::Blob result;
    while (!result.complete()) {
      auto m = root_.receive(dl.left());
      if (!m.ok()) return m.status();
      if (msg::kind_of(*m) == static_cast<std::uint8_t>(Kind::kAbort)) return read_abort(*m);
      FERRY_RETURN_IF_ERROR(result.feed(*m, Kind::kResult, seq, peer_name(0)));
    }
    auto all = msg::decode_parts(result.data, static_cast<std::uint32_t>(size()));
    if (!all.ok()) return all.status().with_context(peer_name(0));
    return all;
  }

  static void send_abort(net::Channel& ch, const Status& why) {
    (void)ch.send(msg::encode_abort(why), kAbortSendTimeout);
  }

  // Rank 0: tells every member that the group failed and why, so that none of them waits
  // for its own timeout. A member reads it in its current or next collective.
  void tell_members(const Status& why) FERRY_REQUIRES(call_mu_) {
    for (net::Channel& p : peers_) {
      if (p.valid() && p.health().ok()) send_abort(p, why);
    }
  }

  // ---- fetches (caller side) ----

  Status fetch_impl(int peer, std::string_view request, std::span<std::byte>* into,
                    std::string* text) override {
    MutexLock lock(call_mu_);
    const Deadline dl(opts_.timeout);
    FetchConn& conn = fetch_conns_[peer];
    if (!conn.ch.valid()) {
      auto ch =
          net::connect(calls_, addresses_[peer], *token_, dl.left(), {.role = peer_name(peer)});
      if (!ch.ok()) return ch.status();
      const std::vector<std::byte> hello =
          msg::encode_fetch_hello({kVersion, static_cast<std::uint32_t>(rank())});
      FERRY_RETURN_IF_ERROR(ch->send(hello, dl.left()));
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
                  std::string* text, const Deadline& dl, bool* out_of_step)
      FERRY_REQUIRES(call_mu_) {
    const std::uint32_t id = ++conn.next_id;
    const std::uint64_t expected = into != nullptr ? into->size() : kAnySize;
    const std::vector<std::byte> m = msg::encode_fetch({id, expected, std::string(request)});
    if (m.size() > net::max_message_bytes()) {
      return invalid_argument("a fetch request of " + std::to_string(request.size()) +
                              " bytes is over the limit of " +
                              std::to_string(net::max_message_bytes()));
    }
    *out_of_step = true;
    FERRY_RETURN_IF_ERROR(conn.ch.send(m, dl.left()));
    auto reply = conn.ch.receive(dl.left());
    if (!reply.ok()) return reply.status();
    auto answer = check_answer(*reply, id, peer, expected);
    if (!answer.ok()) return answer.status();
    if (answer->code != Code::kOk) {
      *out_of_step = false;  // no bulk message follows an error
      return Status(answer->code, answer->error);
    }
    const std::uint64_t bytes = answer->size;
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
    FERRY_RETURN_IF_ERROR(conn.ch.wait(*t, dl.left()));
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
      if (!busy) idle(*serve_, kIdleWait);
    }
    for (ServeConn& c : conns) c.ch.abort();
    conns.clear();
    listener_ = net::Listener();
  }

  // Handles one message on a serving channel; an error drops the channel.
  Status serve_one(ServeConn& c, std::span<const std::byte> m) {
    if (msg::kind_of(m) == static_cast<std::uint8_t>(Kind::kFetchHello)) {
      auto from = check_fetch_hello(m, c.ch.peer());
      if (!from.ok()) return from.status();
      c.from = *from;
      return ok_status();
    }
    auto fetch = msg::decode_fetch(m);
    if (!fetch.ok()) return fetch.status().with_context(c.ch.peer());
    if (c.from < 0) return corruption("a fetch request before the fetch hello from " + c.ch.peer());
    // In place from the start: the bytes of a short `owned` string move with it.
    Outgoing& out = c.sending.emplace_back();
    Status s = send_answer(c, *fetch, out);
    // Nothing in flight (an error answer, or sent already): nothing to keep.
    if (s.ok() && out.transfer.done() && out.transfer.status().ok()) c.sending.pop_back();
    return s;
  }

  // Answers `fetch` into `out`: the answer message, then the bulk transfer.
  Status send_answer(ServeConn& c, const msg::Fetch& fetch, Outgoing& out) {
    FERRY_RETURN_IF_ERROR(c.ch.send(answer_fetch(c.from, fetch, &out.reply), opts_.timeout));
    if (out.reply.bytes().empty()) return ok_status();

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
    auto t = c.ch.send_bulk(fetch.id, bytes, out.region);
    if (!t.ok()) return t.status();
    out.transfer = std::move(*t);
    return ok_status();
  }

  const NetGroupOptions opts_;
  std::optional<net::Token> token_;
  std::vector<std::string> addresses_;  // where each rank serves fetches

  Mutex call_mu_;  // the calling side: calls_ and everything made from it
  std::shared_ptr<net::Context> calls_ FERRY_GUARDED_BY(call_mu_);
  net::Channel root_ FERRY_GUARDED_BY(call_mu_);                // ranks > 0: to rank 0
  std::vector<net::Channel> peers_ FERRY_GUARDED_BY(call_mu_);  // rank 0: to each rank
  std::map<int, FetchConn> fetch_conns_ FERRY_GUARDED_BY(call_mu_);
  std::uint64_t seq_ FERRY_GUARDED_BY(call_mu_) = 0;
  Status broken_ FERRY_GUARDED_BY(call_mu_);

  std::shared_ptr<net::Context> serve_;  // the serving side: server_ alone uses it
  net::Listener listener_;
  std::thread server_;
  std::atomic<bool> stop_{false};
};

}  // namespace

}  // namespace ferry::rank_group

namespace ferry::checkpoint {

Result<std::unique_ptr<RankGroup>> connect_net_group(const NetGroupOptions& options) {
  auto g = std::make_unique<rank_group::NetGroup>(options);
  FERRY_RETURN_IF_ERROR(g->start());
  return std::unique_ptr<RankGroup>(std::move(g));
}

}  // namespace ferry::checkpoint
