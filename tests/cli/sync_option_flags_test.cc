// ferry sync serve / recv / relay take a flag for every option of their roles, made from
// ferry/sync_option_fields.h (issue 32 item 3: options the CLI could not set).
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <vector>

#include "ferry/sync_option_fields.h"
#include "support/test_support.h"

namespace ferry {
namespace {

using ferry::testing::run_ferry;
using ferry::testing::Spawned;

// The flag of a field, by the rule docs/cli.md states: '-' for '_', sizes in MiB as
// --NAME-mb without "_bytes", a bool that is on by default as --no-NAME.
template <typename Field>
std::string flag_of(const Field& field) {
  std::string name(field.name);
  std::replace(name.begin(), name.end(), '_', '-');
  if (field.kind == sync::OptionKind::kBytes) {
    if (name.ends_with("-bytes")) name.resize(name.size() - 6);
    return "--" + name + "-mb";
  }
  if constexpr (std::is_same_v<typename Field::Value, bool>) {
    return (sync::SyncOptions{}.*field.member ? "--no-" : "--") + name;
  }
  return "--" + name;
}

template <const auto& Table>
std::vector<std::string> flags_of() {
  std::vector<std::string> flags;
  std::apply([&](const auto&... field) { (flags.push_back(flag_of(field)), ...); },
             sync::bound_option_fields<Table>());
  return flags;
}

// Whether `help` lists `flag` as a flag of its own (not as the start of a longer one).
bool lists(const std::string& help, const std::string& flag) {
  for (auto at = help.find(flag); at != std::string::npos; at = help.find(flag, at + 1)) {
    const std::size_t end = at + flag.size();
    if ((at == 0 || help[at - 1] == ' ' || help[at - 1] == ',') &&
        (end == help.size() || help[end] == ' ' || help[end] == '\n')) {
      return true;
    }
  }
  return false;
}

TEST(SyncOptionFlags, EachCommandHasAFlagForEveryOptionOfItsRolesAndNoOther) {
  const auto session = flags_of<sync::kSessionOptionFields>();
  const auto sender = flags_of<sync::kSenderOptionFields>();
  const auto receiver = flags_of<sync::kReceiverOptionFields>();
  EXPECT_NE(std::find(sender.begin(), sender.end(), "--bucket-mb"), sender.end());
  EXPECT_NE(std::find(sender.begin(), sender.end(), "--no-checksums"), sender.end());
  EXPECT_NE(std::find(receiver.begin(), receiver.end(), "--delta-keep-limit-mb"), receiver.end());
  struct Command {
    const char* name;
    const std::vector<std::string>& has;
    const std::vector<std::string>& lacks;
  };
  for (const Command& c : {Command{"serve", sender, receiver}, Command{"recv", receiver, sender},
                           Command{"relay", receiver, sender}}) {
    auto r = run_ferry({"sync", c.name, "--help"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    for (const std::string& flag : session) EXPECT_TRUE(lists(r.out, flag)) << c.name << flag;
    for (const std::string& flag : c.has) EXPECT_TRUE(lists(r.out, flag)) << c.name << flag;
    for (const std::string& flag : c.lacks) EXPECT_FALSE(lists(r.out, flag)) << c.name << flag;
  }
}

TEST(SyncOptionFlags, ABadValueIsAUsageErrorNamingTheFlag) {
  auto r = run_ferry({"sync", "recv", "--address", "@ferry-cli-flags", "--max-ring-mb", "lots"});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("--max-ring-mb lots"), std::string::npos) << r.err;
  r = run_ferry({"sync", "serve", "--address", "@ferry-cli-flags", "--delta-threads", "-1"});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("--delta-threads -1"), std::string::npos) << r.err;
  r = run_ferry({"sync", "recv", "--address", "@ferry-cli-flags", "--idle-timeout", "soon"});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("--idle-timeout soon"), std::string::npos) << r.err;
}

// A flag the CLI did not have before reaches the receiver's SyncOptions: the model's
// embedding spans 1 MiB buckets, more than --max-assembled-tensor-mb 1 lets recv assemble.
TEST(SyncOptionFlags, ANewFlagReachesTheSession) {
  const std::string address = "@ferry-cli-flags-" + std::to_string(::getpid());
  Spawned serve(FERRY_BINARY,
                {"sync", "serve", "--address", address, "--layers", "1", "--bucket-mb", "1",
                 "--timeout", "30", "--delta-threads", "1"},
                {});
  auto r = run_ferry(
      {"sync", "recv", "--address", address, "--timeout", "30", "--max-assembled-tensor-mb", "1"});
  EXPECT_NE(r.exit_code, 0) << r.out;
  EXPECT_NE(r.err.find("max_assembled_tensor_bytes"), std::string::npos) << r.err;
  EXPECT_NE(serve.wait(std::chrono::seconds(30)), 0);
}

}  // namespace
}  // namespace ferry
