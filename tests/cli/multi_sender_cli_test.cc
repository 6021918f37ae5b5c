// ferry sync serve --part K/N and ferry sync recv with one address per sender, as a user
// would run them: two processes each serve half a model, one receiver takes the union.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "ferry/model.h"
#include "ferry/sender_parts.h"
#include "support/test_support.h"

namespace ferry {
namespace {

using ferry::testing::run_ferry;
using ferry::testing::spawn_part_servers;

std::uint64_t hex(const nlohmann::json& j) {
  return std::stoull(j.get<std::string>(), nullptr, 16);
}

TEST(MultiSenderCli, TwoPartServersAndOneRecvWithTwoAddressesGetTheWholeModel) {
  constexpr int kRounds = 2;
  const std::string base = "@ferry-cli-parts-" + std::to_string(::getpid());
  const std::vector<std::string> addresses = {base + "-1", base + "-2"};
  auto servers = spawn_part_servers(
      FERRY_BINARY, addresses, {"1/2", "2/2"},
      {"--layers", "1", "--bucket-mb", "16", "--rounds", std::to_string(kRounds), "--json"});
  auto r = run_ferry({"sync", "recv", "--address", addresses[0], "--address", addresses[1],
                      "--layers", "1", "--rounds", std::to_string(kRounds), "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;

  // The whole model, as split among the two servers.
  auto config = model::preset("qwen2.5-0.5b");
  ASSERT_TRUE(config.ok());
  config->num_layers = 1;
  const std::vector<TensorSpec> specs = model::hf_tensor_specs(*config, DType::kBF16);
  std::uint64_t model_bytes = 0;
  for (const TensorSpec& t : specs) model_bytes += t.bytes();
  auto parts = sync::split_into_parts(specs, 2);
  ASSERT_TRUE(parts.ok());

  std::istringstream lines(r.out);
  for (int round = 1; round <= kRounds; ++round) {
    std::string line;
    ASSERT_TRUE(std::getline(lines, line)) << r.out;
    const auto got = nlohmann::json::parse(line);
    EXPECT_EQ(got["round"].get<int>(), round);
    EXPECT_EQ(got["tensors"].get<std::size_t>(), specs.size());
    EXPECT_EQ(got["bytes"].get<std::uint64_t>(), model_bytes);
    // Each end hashes every tensor it handled into a sum: the receiver's is the servers'.
    std::uint64_t sent = 0;
    for (std::size_t k = 0; k < 2; ++k) {
      const auto server = nlohmann::json::parse(servers[k]->read_line());
      EXPECT_EQ(server["round"].get<int>(), round);
      EXPECT_EQ(server["tensors"].get<std::size_t>(), (*parts)[k].size()) << "part " << k + 1;
      sent += hex(server["content_hash"]);
    }
    EXPECT_EQ(hex(got["content_hash"]), sent) << "round " << round;
  }
  for (auto& server : servers) EXPECT_EQ(server->wait(std::chrono::seconds(10)), 0);
}

// Issue 31: parts of two different splits (1/2 and 2/3) do not cover the model; every
// sender's round went through, so recv exited 0 with 12 of the 26 tensors. It reports the
// round it did receive, then fails naming the first missing tensors and how many are missing.
TEST(MultiSenderCli, PartsThatDoNotCoverTheModelFailNamingTheMissingTensors) {
  const std::string base = "@ferry-cli-gap-" + std::to_string(::getpid());
  const std::vector<std::string> addresses = {base + "-1", base + "-2"};
  const std::vector<std::string> parts = {"1/2", "2/3"};
  auto servers =
      spawn_part_servers(FERRY_BINARY, addresses, parts,
                         {"--layers", "2", "--bucket-mb", "16", "--timeout", "30", "--json"});
  auto r = run_ferry({"sync", "recv", "--address", addresses[0], "--address", addresses[1],
                      "--layers", "2", "--timeout", "30", "--json"});

  // What the two parts leave out, in the model's order.
  auto config = model::preset("qwen2.5-0.5b");
  ASSERT_TRUE(config.ok());
  config->num_layers = 2;
  const std::vector<TensorSpec> specs = model::hf_tensor_specs(*config, DType::kBF16);
  auto halves = sync::split_into_parts(specs, 2);
  auto thirds = sync::split_into_parts(specs, 3);
  ASSERT_TRUE(halves.ok() && thirds.ok());
  std::vector<bool> sent(specs.size(), false);
  for (std::size_t i : (*halves)[0]) sent[i] = true;
  for (std::size_t i : (*thirds)[1]) sent[i] = true;
  std::vector<std::string> missing;
  for (std::size_t i = 0; i < specs.size(); ++i) {
    if (!sent[i]) missing.push_back(specs[i].name);
  }
  ASSERT_FALSE(missing.empty());
  ASSERT_GT(missing.size(), 5u);  // so that the error names some and counts the rest

  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  const std::string count = std::to_string(missing.size()) + " missing: ";
  EXPECT_NE(r.err.find(count), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(std::to_string(specs.size() - missing.size()) + " of the " +
                       std::to_string(specs.size()) + " tensors"),
            std::string::npos)
      << r.err;
  for (std::size_t i = 0; i < 5; ++i) {
    EXPECT_NE(r.err.find("'" + missing[i] + "'"), std::string::npos) << missing[i] << ": " << r.err;
  }
  EXPECT_EQ(r.err.find("'" + missing[5] + "'"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("and " + std::to_string(missing.size() - 5) + " more"), std::string::npos)
      << r.err;
  // What did arrive is still reported, and both senders' rounds went through.
  const auto got = nlohmann::json::parse(r.out.substr(0, r.out.find('\n')));
  EXPECT_EQ(got["tensors"].get<std::size_t>(), specs.size() - missing.size());
  for (auto& server : servers) EXPECT_EQ(server->wait(std::chrono::seconds(30)), 0);

  // recv's model must be a preset, at a depth it has.
  auto bad = run_ferry({"sync", "recv", "--address", addresses[0], "--layers", "99"});
  EXPECT_EQ(bad.exit_code, 2) << bad.err;
  EXPECT_NE(bad.err.find("--layers 99"), std::string::npos) << bad.err;
}

TEST(MultiSenderCli, BadPartOrRepeatedAddressIsAUsageErrorNamingIt) {
  for (const char* part : {"3/2", "0/2", "1", "1/0", "a/b"}) {
    auto r = run_ferry({"sync", "serve", "--address", "@ferry-cli-bad-part", "--part", part});
    EXPECT_EQ(r.exit_code, 2) << part << ": " << r.err;
    EXPECT_NE(r.err.find(std::string("--part '") + part + "'"), std::string::npos) << r.err;
  }
  auto twice = run_ferry({"sync", "recv", "--address", "@ferry-cli-twice", "--address",
                          "@ferry-cli-twice", "--timeout", "1"});
  EXPECT_NE(twice.exit_code, 0);
  EXPECT_NE(twice.err.find("'@ferry-cli-twice' is given twice"), std::string::npos) << twice.err;
}

TEST(MultiSenderCli, BenchSendersJsonReportsEachCountAgainstOneSender) {
  auto r = run_ferry({"bench", "sync", "--senders", "1,2", "--tensors", "8", "--tensor-bytes",
                      "262144", "--bucket-mb", "1", "--rounds", "1", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["mode"], "senders");
  ASSERT_EQ(j["results"].size(), 2u);
  for (std::size_t i = 0; i < 2; ++i) {
    const auto& row = j["results"][i];
    EXPECT_EQ(row["senders"].get<std::uint32_t>(), i + 1);
    EXPECT_EQ(row["tensors"].get<std::uint32_t>(), 8u);  // every sender's part together
    EXPECT_EQ(row["bytes"].get<std::uint64_t>(), 8u * 262144);
    EXPECT_GT(row["gbps"].get<double>(), 0);
  }
  EXPECT_DOUBLE_EQ(j["results"][0]["ratio_to_one_sender"].get<double>(), 1.0);
  auto net = run_ferry({"bench", "sync", "--senders", "2", "--net"});
  EXPECT_EQ(net.exit_code, 2) << net.err;
  EXPECT_NE(net.err.find("--senders"), std::string::npos) << net.err;
}

}  // namespace
}  // namespace ferry
