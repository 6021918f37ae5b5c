// ferry/sync_option_fields.h: each role's table lists every field of its struct once, so the
// Python binding made from the tables binds every option (issue 32 item 3: three options
// could not be set from Python, and repr showed 9 of 14).
#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <set>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "ferry/sync_option_fields.h"

namespace ferry::sync {
namespace {

using option_fields_internal::aggregate_field_count;

struct Entry {
  std::string role;
  std::string name;
  OptionKind kind;
  std::string doc;
};

std::vector<Entry> all_entries() {
  std::vector<Entry> entries;
  for_each_option_field([&](std::string_view role, const auto& field) {
    entries.push_back(
        {std::string(role), std::string(field.name), field.kind, std::string(field.doc)});
  });
  return entries;
}

// The counter the static_asserts rely on, on a struct with one member of each kind of type
// the options use: it must count each of them, or a table could match a miscount.
struct OneOfEach {
  std::chrono::milliseconds time{1};
  std::string text;
  WireProtect protect = WireProtect::kNone;
  DeltaMode mode = DeltaMode::kOff;
  std::uint64_t bytes = 0;
  std::uint32_t count = 0;
  bool flag = false;
  std::function<Status()> callback;
};
struct Derived : OneOfEach, SenderOptions {};

TEST(OptionFields, FieldCountCountsEveryMemberType) {
  EXPECT_EQ(aggregate_field_count<OneOfEach>(), 8u);
  EXPECT_EQ(aggregate_field_count<Derived>(), 2u);  // its bases
}

TEST(OptionFields, EachTableCoversItsStruct) {
  EXPECT_EQ(aggregate_field_count<SessionOptions>(),
            std::tuple_size_v<decltype(kSessionOptionFields)>);
  EXPECT_EQ(aggregate_field_count<SenderOptions>(),
            std::tuple_size_v<decltype(kSenderOptionFields)>);
  EXPECT_EQ(aggregate_field_count<ReceiverOptions>(),
            std::tuple_size_v<decltype(kReceiverOptionFields)>);
  // SyncOptions is its three roles and nothing else.
  EXPECT_EQ(aggregate_field_count<SyncOptions>(), 3u);
  EXPECT_EQ(all_entries().size(), aggregate_field_count<SessionOptions>() +
                                      aggregate_field_count<SenderOptions>() +
                                      aggregate_field_count<ReceiverOptions>());
}

TEST(OptionFields, NamesAreUniqueAndEveryFieldHasOneLineOfDoc) {
  std::set<std::string> names;
  for (const Entry& e : all_entries()) {
    EXPECT_TRUE(names.insert(e.name).second) << e.name << " appears twice";
    EXPECT_FALSE(e.doc.empty()) << e.name;
    EXPECT_EQ(e.doc.find('\n'), std::string::npos) << e.name;
    EXPECT_NE(option_kind_name(e.kind), "?") << e.name;
  }
}

TEST(OptionFields, OnlyTheInterruptCallbackIsNotBound) {
  std::vector<std::string> not_bound;
  for (const Entry& e : all_entries()) {
    if (e.kind == OptionKind::kNotBound) not_bound.push_back(e.role + "." + e.name);
  }
  EXPECT_EQ(not_bound, std::vector<std::string>{"session.interrupt"});
}

TEST(OptionFields, RolesComeInTheirOrder) {
  std::vector<std::string> roles;
  for (const Entry& e : all_entries()) {
    if (roles.empty() || roles.back() != e.role) roles.push_back(e.role);
  }
  EXPECT_EQ(roles, (std::vector<std::string>{"session", "sender", "receiver"}));
}

// A member pointer reaches the field of its name in a SyncOptions (the tables point into the
// role structs, which SyncOptions inherits).
TEST(OptionFields, MemberPointersReachSyncOptionsFields) {
  SyncOptions o;
  o.*std::get<0>(kSenderOptionFields).member = 4096;  // bucket_bytes
  EXPECT_EQ(o.bucket_bytes, 4096u);
  o.*std::get<1>(kReceiverOptionFields).member = 7;  // max_ring_bytes
  EXPECT_EQ(o.max_ring_bytes, 7u);
  EXPECT_EQ(std::get<0>(kSenderOptionFields).name, "bucket_bytes");
  EXPECT_EQ(std::get<1>(kReceiverOptionFields).name, "max_ring_bytes");
}

}  // namespace
}  // namespace ferry::sync
