// SyncOptions' fields, one table per role (SessionOptions, SenderOptions, ReceiverOptions in
// ferry/sync.h), for code that presents them outside C++: the Python module makes
// ferry.SyncOptions' constructor keywords, properties and repr from them, and `ferry sync`
// its option flags (src/cli/cmd_sync.cc).
//
// Each table lists every field of its struct once: its name (the C++ member's, which is also
// Python's keyword), a pointer to it, how it is shown outside C++ (OptionKind) and one line of
// doc. A field that only C++ sets (the interrupt callback) is listed with kNotBound, so that a
// count still covers it. The static_asserts at the end fail the build when a struct gains a
// field its table lacks, or when SyncOptions gains one of its own.
//
//   std::apply([](const auto&... f) { ((std::cout << f.name << '\n'), ...); },
//              ferry::sync::kSenderOptionFields);
//
// Everything here is constexpr and header-only: nothing to link, nothing exported.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>

#include "ferry/status.h"
#include "ferry/sync.h"
#include "ferry/wire_protect.h"

namespace ferry::sync {

// How an option is shown outside C++, and so which C++ type its field has.
enum class OptionKind : std::uint8_t {
  kBytes,        // std::uint64_t, a size in bytes
  kCount,        // std::uint32_t, a number of things
  kSeconds,      // std::chrono::milliseconds shown as seconds; negative is -1: wait forever
  kBool,         // bool
  kString,       // std::string
  kWireProtect,  // WireProtect by its name: wire_protect_name / parse_wire_protect
  kDeltaMode,    // DeltaMode by its name: delta_mode_name / parse_delta_mode
  kNotBound,     // set from C++ only (a callback); not shown outside C++
};

// "bytes", "count", "seconds", "bool", "string", "wire_protect", "delta_mode", "not bound".
constexpr std::string_view option_kind_name(OptionKind kind) {
  switch (kind) {
    case OptionKind::kBytes:
      return "bytes";
    case OptionKind::kCount:
      return "count";
    case OptionKind::kSeconds:
      return "seconds";
    case OptionKind::kBool:
      return "bool";
    case OptionKind::kString:
      return "string";
    case OptionKind::kWireProtect:
      return "wire_protect";
    case OptionKind::kDeltaMode:
      return "delta_mode";
    case OptionKind::kNotBound:
      return "not bound";
  }
  return "?";
}

// Whether a field of type T may be shown as `kind`.
template <typename T>
constexpr bool option_kind_fits(OptionKind kind) {
  switch (kind) {
    case OptionKind::kBytes:
      return std::is_same_v<T, std::uint64_t>;
    case OptionKind::kCount:
      return std::is_same_v<T, std::uint32_t>;
    case OptionKind::kSeconds:
      return std::is_same_v<T, std::chrono::milliseconds>;
    case OptionKind::kBool:
      return std::is_same_v<T, bool>;
    case OptionKind::kString:
      return std::is_same_v<T, std::string>;
    case OptionKind::kWireProtect:
      return std::is_same_v<T, WireProtect>;
    case OptionKind::kDeltaMode:
      return std::is_same_v<T, DeltaMode>;
    case OptionKind::kNotBound:
      return true;
  }
  return false;
}

// One field of an options struct. Copyable, constexpr; `name` and `doc` view string literals,
// so their data() is null-terminated and lives as long as the program.
template <typename Struct, typename T>
struct OptionField {
  using Owner = Struct;
  using Value = T;

  std::string_view name;  // the member's name: Python's keyword and property
  T Struct::*member;
  OptionKind kind;
  std::string_view doc;  // one line for docstrings and help; sync.h has the whole contract

  constexpr bool bound() const { return kind != OptionKind::kNotBound; }
};

// The table entry of Struct::member, named after the member itself so that the two cannot
// differ. Used only in this header (#undef below).
#define FERRY_OPTION_FIELD(Struct, member, kind, doc) \
  OptionField<Struct, decltype(Struct::member)> { #member, &Struct::member, OptionKind::kind, doc }

inline constexpr auto kSessionOptionFields = std::tuple{
    FERRY_OPTION_FIELD(SessionOptions, timeout, kSeconds,
                       "Seconds either side waits for its peer inside a round, and the sender "
                       "for receivers to join."),
    FERRY_OPTION_FIELD(SessionOptions, token_file, kString,
                       "Net sessions' secret: this file (mode 0600); '' reads FERRY_TOKEN, else "
                       "the file FERRY_TOKEN_FILE names."),
    FERRY_OPTION_FIELD(SessionOptions, wire_protect, kWireProtect,
                       "'none', 'mac' or 'encrypt': how a net session's tensor bytes travel "
                       "from a sender or relay, and the least a receiver or relay accepts from "
                       "its sender (docs/security.md)."),
    FERRY_OPTION_FIELD(SessionOptions, interrupt, kNotBound,
                       "Called while waiting for a peer; ends the wait with its error. The "
                       "Python module sets it to hear Ctrl-C."),
};

inline constexpr auto kSenderOptionFields = std::tuple{
    FERRY_OPTION_FIELD(SenderOptions, bucket_bytes, kBytes,
                       "Bytes of one bucket (ring slot), a multiple of 16; larger tensors "
                       "stream through it in pieces. Sender only."),
    FERRY_OPTION_FIELD(SenderOptions, slots, kCount,
                       "Ring slots, i.e. buckets in flight. Sender only."),
    FERRY_OPTION_FIELD(SenderOptions, checksums, kBool,
                       "XXH3-64 of every bucket, checked by each receiver. Sender only."),
    FERRY_OPTION_FIELD(SenderOptions, delta, kDeltaMode,
                       "'off', 'on' or 'auto': send only what changed since the last round "
                       "(docs/delta.md); 'auto' only when some peer is over the network and "
                       "little changed, dense rounds when all peers are shm receivers on this "
                       "node. Sender only."),
    FERRY_OPTION_FIELD(SenderOptions, delta_snapshot_limit, kBytes,
                       "Delta rounds: most bytes of tensors (in round order) the sender keeps a "
                       "copy of; later ones are always sent dense. Default: no bound. Sender "
                       "only."),
    FERRY_OPTION_FIELD(SenderOptions, delta_threads, kCount,
                       "Threads that encode a delta round's tensors; 0: hardware concurrency, "
                       "at most 4. Sender only."),
};

inline constexpr auto kReceiverOptionFields = std::tuple{
    FERRY_OPTION_FIELD(ReceiverOptions, idle_timeout, kSeconds,
                       "Seconds a receiver or relay waits for the next round to begin; -1 "
                       "waits forever. A sender that dies is seen at once, one behind a cut "
                       "link only when TCP keepalive gives up (about 30 s)."),
    FERRY_OPTION_FIELD(ReceiverOptions, max_ring_bytes, kBytes,
                       "Net receivers and relays: largest ring (slots x bucket bytes) a sender "
                       "may ask them to allocate; a larger one is refused before any memory is "
                       "taken. Default: a quarter of this machine's memory, at most 16 GiB. "
                       "Receiver only."),
    FERRY_OPTION_FIELD(ReceiverOptions, delta_keep_limit, kBytes,
                       "Most bytes a receiver keeps in copies for delta rounds when it hands "
                       "tensors to callbacks (the model's bytes; destinations keep none). A "
                       "round that would pass it fails (resource exhausted) before anything is "
                       "allocated. Default 64 GiB. Receiver only."),
    FERRY_OPTION_FIELD(ReceiverOptions, max_assembled_tensor_bytes, kBytes,
                       "Largest tensor spanning buckets that a receiver assembles whole for its "
                       "callbacks (destinations need none); a round with a larger one fails "
                       "(resource exhausted) at its start. Default: a quarter of this machine's "
                       "memory, at most 64 GiB. Receiver only."),
};

#undef FERRY_OPTION_FIELD

// Calls f(role, field) for every field of every table: role is "session", "sender" or
// "receiver", in that order, each table in its order.
template <typename F>
constexpr void for_each_option_field(F&& f) {
  std::apply([&](const auto&... field) { (f(std::string_view("session"), field), ...); },
             kSessionOptionFields);
  std::apply([&](const auto&... field) { (f(std::string_view("sender"), field), ...); },
             kSenderOptionFields);
  std::apply([&](const auto&... field) { (f(std::string_view("receiver"), field), ...); },
             kReceiverOptionFields);
}

// The fields of `Table` (one of the three above) shown outside C++, i.e. whose kind is not
// kNotBound, as a tuple: code made for each of them is made for those only.
template <const auto& Table>
constexpr auto bound_option_fields() {
  return []<std::size_t... I>(std::index_sequence<I...>) {
    return std::tuple_cat([] {
      if constexpr (std::get<I>(Table).bound()) {
        return std::tuple(std::get<I>(Table));
      } else {
        return std::tuple<>();
      }
    }()...);
  }
  (std::make_index_sequence<std::tuple_size_v<std::decay_t<decltype(Table)>>>());
}

namespace option_fields_internal {

// Converts to anything, so that T{AnyField{}, ...} compiles for as many as T has fields.
struct AnyField {
  template <typename T>
  operator T&() const;  // declared only: used in unevaluated contexts
};

template <typename T, std::size_t... I>
constexpr bool brace_initializable(std::index_sequence<I...>) {
  return requires { T{(void(I), AnyField{})...}; };
}

// The number of fields of aggregate T whose members are not themselves aggregates (for a
// struct with bases: the bases plus its own fields).
template <typename T, std::size_t N = 0>
constexpr std::size_t aggregate_field_count() {
  if constexpr (brace_initializable<T>(std::make_index_sequence<N + 1>{})) {
    return aggregate_field_count<T, N + 1>();
  } else {
    return N;
  }
}

// Each entry points to a member of Struct of the type it says, fits its kind, and no two
// entries point to the same member.
template <typename Struct, typename... Fields>
constexpr bool table_is_sound(const std::tuple<Fields...>& table) {
  if (!(std::is_same_v<typename Fields::Owner, Struct> && ...)) return false;
  const bool kinds_fit = std::apply(
      [](const auto&... f) {
        return (option_kind_fits<typename std::decay_t<decltype(f)>::Value>(f.kind) && ...);
      },
      table);
  if (!kinds_fit) return false;
  std::size_t same = 0;
  std::apply(
      [&](const auto&... a) {
        auto matches = [&](const auto& x) {
          auto one = [&](const auto& y) -> std::size_t {
            if constexpr (std::is_same_v<decltype(x.member), decltype(y.member)>) {
              return x.member == y.member ? 1 : 0;
            } else {
              return 0;
            }
          };
          return (one(a) + ...);
        };
        same = (matches(a) + ...);
      },
      table);
  return same == sizeof...(Fields);
}

template <typename Struct, typename Table>
constexpr bool table_covers() {
  return aggregate_field_count<Struct>() == std::tuple_size_v<Table>;
}

}  // namespace option_fields_internal

static_assert(option_fields_internal::table_is_sound<SessionOptions>(kSessionOptionFields));
static_assert(option_fields_internal::table_is_sound<SenderOptions>(kSenderOptionFields));
static_assert(option_fields_internal::table_is_sound<ReceiverOptions>(kReceiverOptionFields));
static_assert(
    option_fields_internal::table_covers<SessionOptions, decltype(kSessionOptionFields)>(),
    "a SessionOptions field is missing from kSessionOptionFields");
static_assert(option_fields_internal::table_covers<SenderOptions, decltype(kSenderOptionFields)>(),
              "a SenderOptions field is missing from kSenderOptionFields");
static_assert(
    option_fields_internal::table_covers<ReceiverOptions, decltype(kReceiverOptionFields)>(),
    "a ReceiverOptions field is missing from kReceiverOptionFields");
// Its three bases and nothing else: a new option goes into the struct of its role.
static_assert(option_fields_internal::aggregate_field_count<SyncOptions>() == 3,
              "SyncOptions has a field of its own: move it into the options of its role");

}  // namespace ferry::sync
