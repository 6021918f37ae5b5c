// ferry sync serve / recv / relay / topology: the ends of a weight-sync session, by hand and in
// scripts (tests/netns drives them across network namespaces).
#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <deque>
#include <functional>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string_view>
#include <thread>
#include <unordered_set>
#include <vector>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "cli/commands.h"
#include "cli/progress.h"
#include "ferry/model.h"
#include "ferry/multi_receiver.h"
#include "ferry/relay_topology.h"
#include "ferry/sender_parts.h"
#include "ferry/sync.h"
#include "ferry/sync_option_fields.h"
#include "ferry/vllm_slices.h"

namespace ferry::cli {
namespace {

// The forms of a node-local address (transport/shm/local_address.h).
constexpr const char* kShmAddressHelp =
    "NAME (no '/'): a socket in this user's private 0700 directory ($XDG_RUNTIME_DIR/ferry, "
    "else /tmp/ferry-UID), which no other user can take; @NAME: a Linux abstract socket (no "
    "file; any local user can connect, which is refused, or bind the name first); "
    "a path with '/': that socket file";

// A flag made from a SyncOptions field (ferry/sync_option_fields.h), so that every option of
// a role is a flag of its commands: serve has the session's and the sender's, recv and relay
// the session's and the receiver's. The flag is the field's name with '-' for '_'; sizes are
// given in MiB as --NAME-mb ("_bytes" dropped: bucket_bytes is --bucket-mb), times in seconds
// (negative: forever), and a bool that is on by default is turned off by --no-NAME. The
// value is parsed by check_args, so a bad one is a usage error naming the flag.
struct OptionFlag {
  std::string flag;
  CLI::Option* option = nullptr;  // given when option->count() > 0
  std::string text;               // the value given (a bool's flag takes none)
  std::function<Status(const std::string& text, sync::SyncOptions& o)> set;
};

struct SyncArgs {
  std::string address = "ferry-sync";  // a socket in this user's private directory
  std::string net_address;             // --listen (serve) or --connect (relay): host:port
  // recv: the senders' addresses (--address or --connect, each given once per sender)
  std::vector<std::string> addresses = {"ferry-sync"};
  std::vector<std::string> net_addresses;
  std::string part;  // serve: "K/N", only part K of N of the model (empty: all of it)
  std::string tp;    // recv: "R/N", only tensor-parallel rank R's slices (empty: whole tensors)
  // serve: the model to send; recv: the model its senders' parts make up, checked each round
  // when recv has several senders or is given --preset or --layers (model_flags)
  std::string preset = "qwen2.5-0.5b";
  std::string dtype = "bf16";
  std::int64_t layers = 0;                // 0 = the preset's depth
  std::vector<CLI::Option*> model_flags;  // recv: --preset, --layers
  std::uint32_t receivers = 1;
  std::uint32_t id = 0;
  int rounds = 1;
  bool json = false;
  std::string local = "ferry-relay";  // relay: where local receivers join (shm unless host:port)
  bool keep_going = false;            // after a failed round, rejoin (or re-accept) and go on
  std::string serve_relays;           // relay: host:port where downstream relays join
  std::uint32_t downstream = 0;       // relay: downstream relays to wait for
  // The role's SyncOptions fields; a deque, as CLI11 holds each one's `text` by reference.
  std::deque<OptionFlag> option_flags;
};

// The SyncOptions the command line gives: the defaults, with each option flag given applied.
Result<sync::SyncOptions> parse_options(const SyncArgs& a) {
  sync::SyncOptions o;
  for (const OptionFlag& f : a.option_flags) {
    if (f.option->count() == 0) continue;
    if (Status st = f.set(f.text, o); !st.ok()) return st;
  }
  return o;
}

// What parse_options gives; check_args has seen that it parses.
sync::SyncOptions options_of(const SyncArgs& a) {
  auto o = parse_options(a);
  return o.ok() ? *std::move(o) : sync::SyncOptions{};
}

// The whole of `text` as a T (an unsigned integer or a double), else nullopt.
template <typename T>
std::optional<T> parse_number(const std::string& text) {
  T value{};
  const char* end = text.data() + text.size();
  const auto [stop, error] = std::from_chars(text.data(), end, value);
  if (error != std::errc() || stop != end) return std::nullopt;
  return value;
}

// OptionFlag's rules for one field: the flag, its help and default, and how it sets the field.
template <typename Field>
void add_option_flag(CLI::App* cmd, std::deque<OptionFlag>& flags, const Field& field) {
  using T = typename Field::Value;
  const auto member = field.member;
  std::string name(field.name);
  std::replace(name.begin(), name.end(), '_', '-');
  const T fallback = sync::SyncOptions{}.*member;
  // The role is the command's: "Sender only." says nothing on serve's flags.
  std::string help(field.doc);
  for (std::string_view role : {" Sender only.", " Receiver only."}) {
    if (help.ends_with(role)) help.resize(help.size() - role.size());
  }
  std::string shown;  // the default, as given on the command line
  std::string type = "TEXT";
  OptionFlag& f = flags.emplace_back();
  if constexpr (std::is_same_v<T, bool>) {
    f.flag = (fallback ? "--no-" : "--") + name;
    f.set = [member, fallback](const std::string&, sync::SyncOptions& o) {
      o.*member = !fallback;
      return ok_status();
    };
    f.option = cmd->add_flag(f.flag)->description((fallback ? "Turn off: " : "") + help);
    return;
  } else if constexpr (std::is_same_v<T, std::uint64_t>) {  // bytes, given in MiB
    if (name.ends_with("-bytes")) name.resize(name.size() - 6);
    f.flag = "--" + name + "-mb";
    type = "MiB";
    shown = fallback == UINT64_MAX ? "no bound" : std::to_string(fallback >> 20);
    f.set = [member, flag = f.flag](const std::string& text, sync::SyncOptions& o) -> Status {
      const auto mb = parse_number<std::uint64_t>(text);
      if (!mb || *mb > (UINT64_MAX >> 20)) {
        return invalid_argument(
            fmt::format("{} {}: give a size in MiB, at most {}", flag, text, UINT64_MAX >> 20));
      }
      o.*member = *mb << 20;
      return ok_status();
    };
  } else if constexpr (std::is_same_v<T, std::uint32_t>) {
    f.flag = "--" + name;
    type = "UINT";
    shown = std::to_string(fallback);
    f.set = [member, flag = f.flag](const std::string& text, sync::SyncOptions& o) -> Status {
      const auto n = parse_number<std::uint32_t>(text);
      if (!n) return invalid_argument(fmt::format("{} {}: give a whole number", flag, text));
      o.*member = *n;
      return ok_status();
    };
  } else if constexpr (std::is_same_v<T, std::chrono::milliseconds>) {
    f.flag = "--" + name;
    type = "SECONDS";
    shown = fallback.count() < 0 ? "-1 (forever)" : fmt::format("{:g}", fallback.count() / 1e3);
    f.set = [member, flag = f.flag](const std::string& text, sync::SyncOptions& o) -> Status {
      const auto s = parse_number<double>(text);
      if (!s || std::isnan(*s)) {
        return invalid_argument(
            fmt::format("{} {}: give seconds, or a negative number to wait forever", flag, text));
      }
      // Negative, or past what milliseconds hold: forever.
      o.*member = *s < 0 || *s * 1e3 >= 9.2e18
                      ? std::chrono::milliseconds(-1)
                      : std::chrono::milliseconds(static_cast<std::int64_t>(*s * 1e3));
      return ok_status();
    };
  } else if constexpr (std::is_same_v<T, std::string>) {
    f.flag = "--" + name;
    f.set = [member](const std::string& text, sync::SyncOptions& o) {
      o.*member = text;
      return ok_status();
    };
  } else {  // WireProtect, DeltaMode: by name
    f.flag = "--" + name;
    if constexpr (std::is_same_v<T, WireProtect>) {
      shown = std::string(wire_protect_name(fallback));
    } else {
      shown = std::string(sync::delta_mode_name(fallback));
    }
    f.set = [member, flag = f.flag](const std::string& text, sync::SyncOptions& o) -> Status {
      auto value = [&] {
        if constexpr (std::is_same_v<T, WireProtect>) {
          return parse_wire_protect(text);
        } else {
          return sync::parse_delta_mode(text);
        }
      }();
      if (!value.ok()) return invalid_argument(flag + ": " + value.status().message());
      o.*member = *value;
      return ok_status();
    };
  }
  f.option = cmd->add_option(f.flag, f.text, help)->type_name(type);
  if (!shown.empty()) f.option->default_str(shown);
}

// The flags of every field of `Table` shown outside C++.
template <const auto& Table>
void add_option_flags(CLI::App* cmd, SyncArgs* a) {
  std::apply([&](const auto&... field) { (add_option_flag(cmd, a->option_flags, field), ...); },
             sync::bound_option_fields<Table>());
}

// ferry sync topology: which relay feeds which.
struct TopologyArgs {
  std::uint32_t nodes = 1;
  std::string shape = "auto";
  std::uint32_t fanout = sync::RelayTopologyOptions{}.fanout;
  std::uint32_t max_chain_nodes = sync::RelayTopologyOptions{}.max_chain_nodes;
  bool json = false;
};

// Under --keep-going a failed round is reported and the loop goes on.
void report_round_failure(const Status& s, int round) {
  std::fprintf(stderr, "ferry: round attempt %d failed, going on: %s\n", round,
               s.to_string().c_str());
  std::fflush(stderr);
}

// XXH3 of every tensor's name and bytes, combined so that the order does not matter: both
// ends print it, so a script can check every byte arrived without trusting either end.
struct ContentHash {
  std::uint64_t value = 0;
  void add(const TensorView& t) {
    value += XXH3_64bits_withSeed(t.data.data(), t.data.size(),
                                  XXH3_64bits(t.spec.name.data(), t.spec.name.size()));
  }
};

// serve --part K/N: part K (1..N) of the model split among N senders.
struct Part {
  std::uint32_t index = 0;  // K - 1
  std::uint32_t count = 1;  // N
};

// The whole of `text` as a number, else 0.
std::uint32_t whole_number(std::string_view text) {
  std::uint32_t n = 0;
  const char* end = text.data() + text.size();
  const auto [stop, error] = std::from_chars(text.data(), end, n);
  return error == std::errc() && stop == end ? n : 0;
}

Result<Part> parse_part(const std::string& text) {
  const auto slash = text.find('/');
  const std::string_view whole(text);
  const std::uint32_t k = slash == std::string::npos ? 0 : whole_number(whole.substr(0, slash));
  const std::uint32_t n = slash == std::string::npos ? 0 : whole_number(whole.substr(slash + 1));
  if (k < 1 || k > n) {
    return invalid_argument(
        fmt::format("--part '{}': give K/N, part K of N (1 <= K <= N), e.g. --part 1/2", text));
  }
  return Part{k - 1, n};
}

// --preset at --layers (0: all its layers); invalid_argument naming the flag otherwise.
Result<model::ModelConfig> model_config(const SyncArgs& a) {
  auto cfg = model::preset(a.preset);
  if (!cfg.ok()) return cfg.status();
  if (a.layers < 0 || a.layers > cfg->num_layers) {
    return invalid_argument(fmt::format("--layers {}: {} has 1 to {} layers (0: all)", a.layers,
                                        a.preset, cfg->num_layers));
  }
  if (a.layers > 0) cfg->num_layers = a.layers;
  return cfg;
}

// The tensors of model_config(a) in `dtype`.
Result<std::vector<TensorSpec>> model_specs(const SyncArgs& a, DType dtype) {
  auto cfg = model_config(a);
  if (!cfg.ok()) return cfg.status();
  return model::hf_tensor_specs(*cfg, dtype);
}

// recv --tp R/N: rank R's slices of every tensor of the model, as vLLM cuts them, and the
// memory each is received into (zeros: vocabulary padding stays zero, as vLLM keeps it).
struct RankLocal {
  std::vector<TensorSlice> slices;
  std::vector<std::vector<std::byte>> local;
};

Result<RankLocal> rank_local_destinations(const SyncArgs& a) {
  const auto slash = a.tp.find('/');
  const std::string_view text(a.tp);
  const bool zero = slash != std::string::npos && text.substr(0, slash) == "0";
  const std::uint32_t r = slash == std::string::npos ? 0 : whole_number(text.substr(0, slash));
  const std::uint32_t n = slash == std::string::npos ? 0 : whole_number(text.substr(slash + 1));
  if ((r == 0 && !zero) || n == 0 || r >= n) {
    return invalid_argument(fmt::format(
        "--tp '{}': give R/N, tensor-parallel rank R of N (0 <= R < N), e.g. --tp 0/2", a.tp));
  }
  auto cfg = model_config(a);
  if (!cfg.ok()) return cfg.status();
  auto dtype = parse_dtype(a.dtype);
  if (!dtype.ok()) return dtype.status();
  const std::vector<TensorSpec> specs = model::hf_tensor_specs(*cfg, *dtype);
  auto slices = convert::vllm_tp_slices(*cfg, specs, static_cast<int>(r), static_cast<int>(n));
  if (!slices.ok()) return slices.status();
  RankLocal out{std::move(*slices), {}};
  for (const TensorSlice& s : out.slices) out.local.emplace_back(s.local.bytes(), std::byte{0});
  return out;
}

// What is wrong in the command line, found before anything is served or joined. `role`
// is "serve", "recv" or "relay"; `net_flag` names the host:port flag of that role.
Status check_args(const SyncArgs& a, const std::string& role, const std::string& net_flag) {
  if (a.rounds < 1)
    return invalid_argument("--rounds " + std::to_string(a.rounds) + ": give 1 or more");
  // A relay that only feeds relays needs no local receiver.
  if (role != "recv" && a.receivers < 1 && !(role == "relay" && a.downstream > 0)) {
    return invalid_argument("--receivers 0: give 1 or more");
  }
  if (a.downstream > 0 && a.serve_relays.empty()) {
    return invalid_argument(fmt::format(
        "--downstream {}: give --serve-relays HOST:PORT for them to join", a.downstream));
  }
  if (!a.serve_relays.empty()) {
    if (Status st = check_host_port("--serve-relays", a.serve_relays); !st.ok()) return st;
    if (a.downstream < 1) return invalid_argument("--serve-relays: give --downstream 1 or more");
  }
  auto options = parse_options(a);
  if (!options.ok()) return options.status();
  if (options->timeout.count() <= 0) {
    return invalid_argument("--timeout must be a positive number of seconds");
  }
  if (!a.net_address.empty()) {
    if (Status st = check_host_port(net_flag, a.net_address); !st.ok()) return st;
  }
  for (const std::string& address : a.net_addresses) {
    if (Status st = check_host_port(net_flag, address); !st.ok()) return st;
  }
  if (!a.part.empty()) {
    if (auto p = parse_part(a.part); !p.ok()) return p.status();
  }
  if (role == "serve") {
    const std::uint64_t bucket_mb = options->bucket_bytes >> 20;
    if (Status st = check_bucket_mb("--bucket-mb", bucket_mb); !st.ok()) return st;
    if (options->slots < 1 || options->slots > 64) {
      return invalid_argument("--slots " + std::to_string(options->slots) + ": give 1..64");
    }
    if (auto cfg = model::preset(a.preset); !cfg.ok()) return cfg.status();
    if (auto dtype = parse_dtype(a.dtype); !dtype.ok()) return dtype.status();
  }
  if (role == "recv") {
    if (auto specs = model_specs(a, DType::kBF16); !specs.ok()) return specs.status();
  }
  return ok_status();
}

// The address this end uses: --listen / --connect when given, else --address.
const std::string& address_of(const SyncArgs& a) {
  return a.net_address.empty() ? a.address : a.net_address;
}

void print_round(const SyncArgs& a, const sync::RoundStats& s, const char* role,
                 const ContentHash* content) {
  if (a.json) {
    nlohmann::ordered_json j = {{"role", role},
                                {"round", s.round},
                                {"tensors", s.tensors},
                                {"buckets", s.buckets},
                                {"bytes", s.bytes},
                                {"seconds", s.seconds},
                                {"checksum", fmt::format("{:016x}", s.checksum)},
                                {"delta", s.delta},
                                {"wire_bytes", s.wire_bytes}};
    if (std::string_view(role) == "receiver") j["delivered_bytes"] = s.delivered_bytes;
    if (content != nullptr) j["content_hash"] = fmt::format("{:016x}", content->value);
    std::cout << j.dump() << std::endl;
    return;
  }
  std::printf("round %llu: %u tensors, %u buckets, %s in %.3f s (%.2f GB/s), checksum %016llx",
              static_cast<unsigned long long>(s.round), s.tensors, s.buckets,
              format_bytes(s.bytes).c_str(), s.seconds,
              s.seconds > 0 ? s.bytes / 1e9 / s.seconds : 0.0,
              static_cast<unsigned long long>(s.checksum));
  if (content != nullptr) {
    std::printf(", content %016llx", static_cast<unsigned long long>(content->value));
  }
  if (std::string_view(role) == "receiver" && s.delivered_bytes != s.bytes) {
    std::printf(", %s of it copied (rank-local)", format_bytes(s.delivered_bytes).c_str());
  }
  std::printf("\n");
  std::fflush(stdout);
}

int run_serve(const SyncArgs& a) {
  if (Status s = check_args(a, "serve", "--listen"); !s.ok()) return usage_error(s);
  auto dtype = parse_dtype(a.dtype);
  if (!dtype.ok()) return report_error(dtype.status());
  auto model = model_specs(a, *dtype);
  if (!model.ok()) return usage_error(model.status());
  std::vector<TensorSpec> specs = *std::move(model);
  std::string what = a.preset;
  if (!a.part.empty()) {
    // The same split in every `serve --part` process: each serves its own tensors.
    auto part = parse_part(a.part);
    auto parts = sync::split_into_parts(specs, part->count);
    if (!parts.ok()) return report_error(parts.status());
    std::vector<TensorSpec> mine;
    for (std::size_t i : (*parts)[part->index]) mine.push_back(specs[i]);
    specs = std::move(mine);
    what = fmt::format("part {} of {}", a.part, a.preset);
  }
  std::vector<std::span<std::byte>> data;
  std::vector<std::unique_ptr<std::byte[]>> storage;
  std::vector<TensorView> views;
  // Not zero-filled: pages are touched by the first round's fill, after the peers joined,
  // so peers that connect at once are not kept waiting (zeroing a model's worth of memory
  // takes seconds on a loaded node, longer than a short --timeout).
  for (const TensorSpec& s : specs) {
    storage.push_back(std::make_unique_for_overwrite<std::byte[]>(s.bytes()));
    data.emplace_back(storage.back().get(), s.bytes());
  }
  auto sender = sync::Sender::create(address_of(a), options_of(a));
  if (!sender.ok()) return report_error(sender.status());
  // Always said, on stderr under --json: with port 0 it is how scripts learn the port.
  std::fprintf(a.json ? stderr : stdout,
               "serving %s (%zu tensors) on %s, session %016llx; waiting for %u receiver(s)\n",
               what.c_str(), specs.size(), (*sender)->address().c_str(),
               static_cast<unsigned long long>((*sender)->session_id()), a.receivers);
  std::fflush(a.json ? stderr : stdout);
  Status s = (*sender)->accept(a.receivers);
  if (!s.ok()) return report_error(s);
  for (int r = 1; r <= a.rounds; ++r) {
    views.clear();
    ContentHash content;
    for (std::size_t i = 0; i < specs.size(); ++i) {
      model::fill_synthetic(static_cast<std::uint64_t>(r), specs[i].name, 0, data[i]);
      views.push_back({specs[i], data[i]});
      content.add(views.back());
    }
    auto st = (*sender)->send_round(views);
    if (!st.ok()) {
      if (!a.keep_going || r == a.rounds) return report_error(st.status());
      report_round_failure(st.status(), r);
      // The same sender starts a new session; peers that come back join it.
      s = (*sender)->accept(a.receivers);
      if (!s.ok()) return report_error(s);
      continue;
    }
    print_round(a, *st, "sender", &content);
  }
  return kExitOk;
}

// --keep-going rejoins right after a failure, when the sender or relay it rejoins may still be
// tearing its old session down: a connection it accepted and then closed (kAborted, before
// WELCOME) is a lost race, not a verdict, so try again until --timeout has passed.
template <class Join>
auto rejoin(const SyncArgs& a, Join join) -> decltype(join()) {
  const auto deadline = std::chrono::steady_clock::now() + options_of(a).timeout;
  while (true) {
    auto joined = join();
    if (joined.ok() || joined.status().code() != Code::kAborted ||
        std::chrono::steady_clock::now() >= deadline) {
      return joined;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

// recv's session: a Receiver for one sender, a MultiReceiver for several.
class RecvSession {
 public:
  static Result<RecvSession> join(const std::vector<std::string>& addresses, const SyncArgs& a) {
    RecvSession session;
    if (addresses.size() == 1) {
      auto one = sync::Receiver::connect(addresses[0], a.id, options_of(a));
      if (!one.ok()) return one.status();
      session.one_ = std::move(*one);
    } else {
      auto many = sync::MultiReceiver::connect(addresses, a.id, options_of(a));
      if (!many.ok()) return many.status();
      session.many_ = std::move(*many);
    }
    return session;
  }
  Result<sync::RoundStats> receive_round(const sync::TensorCallback& on_tensor) {
    return one_ ? one_->receive_round(on_tensor) : many_->receive_round(on_tensor);
  }
  // Rank-local: every round into `rank`'s slices.
  Result<sync::RoundStats> receive_round_into(RankLocal& rank) {
    for (std::size_t i = 0; i < rank.slices.size(); ++i) {
      Status s = one_ ? one_->set_destination(rank.slices[i], rank.local[i])
                      : many_->set_destination(rank.slices[i], rank.local[i]);
      if (!s.ok()) return s;
    }
    return one_ ? one_->receive_round_into() : many_->receive_round_into();
  }

 private:
  std::unique_ptr<sync::Receiver> one_;
  std::unique_ptr<sync::MultiReceiver> many_;
};

// How many missing tensors an error names before it only counts them.
constexpr std::size_t kMissingNamed = 5;

// recv's check that a round held the whole model (the tensors of --preset at --layers): its
// senders' parts may not cover it (serve --part 1/2 and --part 2/3, or a sender left out),
// and every sender's round can be OK without a word of what no sender sent. kNotFound naming
// the first kMissingNamed missing tensors and how many are missing.
Status check_covers_model(const SyncArgs& a, std::uint64_t round,
                          std::span<const std::string> model,
                          const std::unordered_set<std::string>& received, std::size_t senders) {
  std::vector<std::string_view> missing;
  for (const std::string& name : model) {
    if (!received.contains(name)) missing.push_back(name);
  }
  if (missing.empty()) return ok_status();
  std::string named;
  for (std::size_t i = 0; i < std::min(missing.size(), kMissingNamed); ++i) {
    named += fmt::format("{}'{}'", i == 0 ? "" : ", ", missing[i]);
  }
  if (missing.size() > kMissingNamed)
    named += fmt::format(" and {} more", missing.size() - kMissingNamed);
  const std::string depth = a.layers > 0 ? fmt::format("{} layers", a.layers) : "all layers";
  return not_found(fmt::format(
      "round {}: {} of the {} tensors of {} ({}) arrived from {} sender(s); {} missing: {}. "
      "Give recv one address per part of one split (serve --part K/N, K = 1..N, the same N) "
      "and the senders' --preset and --layers",
      round, model.size() - missing.size(), model.size(), a.preset, depth, senders, missing.size(),
      named));
}

int run_recv(const SyncArgs& a) {
  if (Status s = check_args(a, "recv", "--connect"); !s.ok()) return usage_error(s);
  const std::vector<std::string>& addresses =
      a.net_addresses.empty() ? a.addresses : a.net_addresses;
  // The model each round must cover: checked with several senders (each a part of it) or when
  // recv is told the model; one sender without --preset or --layers sends what it sends.
  const bool model_given = std::any_of(a.model_flags.begin(), a.model_flags.end(),
                                       [](const CLI::Option* o) { return o->count() > 0; });
  std::vector<std::string> model;
  if (addresses.size() > 1 || model_given) {
    auto specs = model_specs(a, DType::kBF16);  // names only: the dtype does not matter
    if (!specs.ok()) return usage_error(specs.status());
    for (const TensorSpec& t : *specs) model.push_back(t.name);
  }
  std::optional<RankLocal> rank;
  if (!a.tp.empty()) {
    auto slices = rank_local_destinations(a);
    if (!slices.ok()) return usage_error(slices.status());
    rank = std::move(*slices);
    // Destination mode: a round's tensor without a slice fails by name, and names are unique
    // in a round, so a round covers the model when it has as many tensors as the model.
    model.clear();
  }
  auto rx = RecvSession::join(addresses, a);
  if (!rx.ok()) return report_error(rx.status());
  for (int r = 1; r <= a.rounds; ++r) {
    // Per-tensor delivery (or into rank-local slices, hashed after); the round checksum
    // printed below is what both ends agreed on.
    ContentHash content;
    std::unordered_set<std::string> received;
    auto st = rank ? rx->receive_round_into(*rank) : rx->receive_round([&](const TensorView& t) {
      content.add(t);
      if (!model.empty()) received.insert(t.spec.name);
      return ok_status();
    });
    if (rank && st.ok()) {
      for (std::size_t i = 0; i < rank->slices.size(); ++i) {
        content.add({rank->slices[i].local, rank->local[i]});
      }
    }
    if (!st.ok()) {
      if (!a.keep_going || r == a.rounds) return report_error(st.status());
      report_round_failure(st.status(), r);
      rx = internal_error("unset");  // closes the old sessions before joining anew
      rx = rejoin(a, [&] { return RecvSession::join(addresses, a); });
      if (!rx.ok()) return report_error(rx.status());
      continue;
    }
    // What did arrive is reported either way; a round short of the model then fails.
    print_round(a, *st, "receiver", &content);
    Status covered = check_covers_model(a, st->round, model, received, addresses.size());
    if (rank && st->tensors < rank->slices.size()) {
      covered = not_found(fmt::format(
          "round {}: {} of the {} tensors of {} arrived from {} sender(s) into --tp slices; the "
          "rest keep what they held. Give recv one address per part of one split and the "
          "senders' --preset and --layers",
          st->round, st->tensors, rank->slices.size(), a.preset, addresses.size()));
    }
    if (Status s = covered; !s.ok()) {
      // The sessions are intact (every sender's round went through): under --keep-going the
      // next round is received on them.
      if (!a.keep_going || r == a.rounds) return report_error(s);
      report_round_failure(s, r);
    }
  }
  return kExitOk;
}

Result<std::unique_ptr<sync::Relay>> join_as_relay(const SyncArgs& a) {
  auto relay = sync::Relay::connect(address_of(a), a.id, a.local, options_of(a), a.serve_relays);
  if (!relay.ok()) return relay.status();
  if (a.downstream > 0) {
    // Scripts read the address downstream relays join from this line (port 0: the one bound).
    std::fprintf(a.json ? stderr : stdout, "relay %u serves %u relay(s) on %s\n", a.id,
                 a.downstream, (*relay)->relays_address().c_str());
  }
  std::fprintf(a.json ? stderr : stdout,
               "relay %u joined %s (session %016llx); waiting for %u local receiver(s) on %s\n",
               a.id, address_of(a).c_str(), static_cast<unsigned long long>((*relay)->session_id()),
               a.receivers, (*relay)->local_address().c_str());
  std::fflush(a.json ? stderr : stdout);
  Status s = (*relay)->accept(a.receivers, a.downstream);
  if (!s.ok()) return s;
  return relay;
}

int run_relay(const SyncArgs& a) {
  if (Status s = check_args(a, "relay", "--connect"); !s.ok()) return usage_error(s);
  auto relay = join_as_relay(a);
  if (!relay.ok()) return report_error(relay.status());
  for (int r = 1; r <= a.rounds; ++r) {
    auto st = (*relay)->relay_round();
    if (!st.ok()) {
      if (!a.keep_going || r == a.rounds) return report_error(st.status());
      report_round_failure(st.status(), r);
      relay->reset();  // frees the local address for the next relay session
      relay = rejoin(a, [&] { return join_as_relay(a); });
      if (!relay.ok()) return report_error(relay.status());
      continue;
    }
    print_round(a, *st, "relay", nullptr);
  }
  return kExitOk;
}

int run_topology(const TopologyArgs& a) {
  auto shape = sync::parse_relay_shape(a.shape);
  if (!shape.ok())
    return usage_error(Status(shape.status().code(), "--shape: " + shape.status().message()));
  sync::RelayTopologyOptions o;
  o.shape = *shape;
  o.fanout = a.fanout;
  o.max_chain_nodes = a.max_chain_nodes;
  auto plan = sync::relay_topology(a.nodes, o);
  if (!plan.ok()) return usage_error(plan.status());
  nlohmann::ordered_json nodes = nlohmann::ordered_json::array();
  for (std::size_t i = 0; i < plan->size(); ++i) {
    const sync::RelayPlacement& p = (*plan)[i];
    const std::string upstream =
        p.upstream == sync::RelayPlacement::kSender ? "sender" : std::to_string(p.upstream);
    if (a.json) {
      nodes.push_back(
          {{"node", i}, {"upstream", upstream}, {"downstream", p.downstream}, {"depth", p.depth}});
    } else {
      std::printf("node %zu upstream %s downstream %u depth %u\n", i, upstream.c_str(),
                  p.downstream, p.depth);
    }
  }
  if (a.json) std::printf("%s\n", nodes.dump().c_str());
  return kExitOk;
}

// The flags every end shares: the session's options, and the rounds.
void add_common(CLI::App* cmd, SyncArgs* a) {
  cmd->add_option("--rounds", a->rounds, "Rounds to run")->capture_default_str();
  add_option_flags<sync::kSessionOptionFields>(cmd, a);
  cmd->add_flag("--json", a->json, "Print one JSON object per round");
  cmd->add_flag("--keep-going", a->keep_going,
                "After a failed round, report it and go on: the sender starts a new session "
                "on the same address, receivers and relays join it again");
}

}  // namespace

void add_sync_command(CLI::App& app, Dispatch& dispatch) {
  CLI::App* sync = app.add_subcommand(
      "sync", "Weight sync: a sender, its receivers, and per-node relays across the network");
  sync->require_subcommand(1);
  auto args = std::make_shared<SyncArgs>();
  CLI::App* serve = add_command(
      *sync, dispatch, "serve",
      "Serve rounds of a model-shaped synthetic state to N receivers (shm) or relays (net)",
      "ferry sync serve --address @job42 --receivers 2 --rounds 3 --bucket-mb 64\n"
      "  FERRY_TOKEN_FILE=~/.ferry/token ferry sync serve --listen 0.0.0.0:5555 --receivers 2",
      [args] { return run_serve(*args); });
  auto* where = serve->add_option("--address", args->address, kShmAddressHelp);
  where->capture_default_str();
  serve
      ->add_option("--listen", args->net_address,
                   "host:port to serve relays and receivers on other nodes (port 0: any)")
      ->excludes(where);
  serve->add_option("--preset", args->preset, "Model shapes to send")->capture_default_str();
  serve->add_option("--part", args->part,
                    "K/N: serve only part K of the model split among N senders (disjoint "
                    "parts of about equal bytes; `ferry sync recv` with N addresses takes all)");
  serve->add_option("--dtype", args->dtype, "dtype of the tensors")->capture_default_str();
  serve
      ->add_option("--layers", args->layers,
                   "Send only this many of the preset's layers, shapes unchanged (0: all)")
      ->capture_default_str();
  serve->add_option("--receivers", args->receivers, "Receivers (or relays) to wait for")
      ->capture_default_str();
  add_option_flags<sync::kSenderOptionFields>(serve, args.get());
  add_common(serve, args.get());
  auto rargs = std::make_shared<SyncArgs>();
  CLI::App* recv = add_command(
      *sync, dispatch, "recv",
      "Join a session (or one of each of several senders') and receive rounds (per-tensor "
      "delivery, checksummed)",
      "ferry sync recv --address @job42 --id 0 --rounds 3\n"
      "  ferry sync recv --address @job42-part1 --address @job42-part2   # two senders\n"
      "  FERRY_TOKEN_FILE=~/.ferry/token ferry sync recv --connect 10.0.0.1:5555 --id 0",
      [rargs] { return run_recv(*rargs); });
  auto* from = recv->add_option(
      "--address", rargs->addresses,
      std::string("Sender's (or this node's relay's) address, once per sender (serve --part): ") +
          kShmAddressHelp);
  from->capture_default_str();
  recv->add_option("--connect", rargs->net_addresses,
                   "Sender's host:port on another node, once per sender (serve --part)")
      ->excludes(from);
  recv->add_option("--id", rargs->id, "This receiver's id (unique in the session)")
      ->capture_default_str();
  rargs->model_flags = {
      recv->add_option("--preset", rargs->preset,
                       "The model the senders' parts make up (serve --preset): with several "
                       "senders, or this flag or --layers given, a round missing any of its "
                       "tensors fails naming them")
          ->capture_default_str(),
      recv->add_option("--layers", rargs->layers,
                       "The senders' serve --layers (0: all of the preset's), for that check")
          ->capture_default_str()};
  recv->add_option("--tp", rargs->tp,
                   "R/N: receive only tensor-parallel rank R's slice of each tensor (0 <= R < N), "
                   "as vLLM cuts them (rank-local delivery; --preset, --layers and --dtype give "
                   "the model). The content hash is then of the slices");
  recv->add_option("--dtype", rargs->dtype, "The senders' serve --dtype, for --tp")
      ->capture_default_str();
  add_option_flags<sync::kReceiverOptionFields>(recv, rargs.get());
  add_common(recv, rargs.get());

  auto xargs = std::make_shared<SyncArgs>();
  CLI::App* relay = add_command(
      *sync, dispatch, "relay",
      "On a receiving node: take each bucket once from the network and republish it to this "
      "node's receivers over shm",
      "FERRY_TOKEN_FILE=~/.ferry/token ferry sync relay --connect 10.0.0.1:5555 --id 1 --local "
      "@job42 "
      "--receivers 2 --rounds 3",
      [xargs] { return run_relay(*xargs); });
  relay->add_option("--connect", xargs->net_address, "Sender's host:port")->required();
  relay->add_option("--id", xargs->id, "This relay's id (unique among the sender's peers)")
      ->capture_default_str();
  relay
      ->add_option("--local", xargs->local,
                   std::string("Address this node's receivers join: ") + kShmAddressHelp)
      ->capture_default_str();
  relay->add_option("--receivers", xargs->receivers, "Local receivers to wait for")
      ->capture_default_str();
  relay->add_option("--serve-relays", xargs->serve_relays,
                    "host:port where downstream relays (a chain or tree; see `ferry sync "
                    "topology`) join this relay as they would the sender (port 0: any, printed)");
  relay
      ->add_option("--downstream", xargs->downstream,
                   "Downstream relays to wait for (needs --serve-relays); with it --receivers "
                   "may be 0")
      ->capture_default_str();
  add_option_flags<sync::kReceiverOptionFields>(relay, xargs.get());
  add_common(relay, xargs.get());

  auto targs = std::make_shared<TopologyArgs>();
  CLI::App* topology = add_command(
      *sync, dispatch, "topology",
      "Which relay feeds which for N receiving nodes: a chain for few, a tree of --fanout past "
      "--max-chain-nodes (the sender feeds node 0 only)",
      "ferry sync topology --nodes 3            # node 0 <- sender, 1 <- 0, 2 <- 1\n"
      "  ferry sync topology --nodes 7 --shape tree --fanout 2 --json",
      [targs] { return run_topology(*targs); });
  topology->add_option("--nodes", targs->nodes, "Receiving nodes (one relay each)")
      ->capture_default_str();
  topology->add_option("--shape", targs->shape, "auto, chain or tree")->capture_default_str();
  topology->add_option("--fanout", targs->fanout, "Tree: relays each relay feeds")
      ->capture_default_str();
  topology
      ->add_option("--max-chain-nodes", targs->max_chain_nodes,
                   "auto: the most nodes served as a chain")
      ->capture_default_str();
  topology->add_flag("--json", targs->json, "Print one JSON array of the nodes");
}

}  // namespace ferry::cli
