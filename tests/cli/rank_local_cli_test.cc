// ferry sync recv --tp R/N: each tensor-parallel rank receives only its vLLM slices of one
// served model (rank-local delivery), and says how many bytes it copied.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "ferry/model.h"
#include "ferry/vllm_slices.h"
#include "support/test_support.h"

namespace ferry {
namespace {

using ferry::testing::run_ferry;
using ferry::testing::spawn_part_servers;
using ferry::testing::Spawned;

TEST(RankLocalCli, TwoRanksEachCopyOnlyTheirSlices) {
  const std::string address = "@ferry-cli-tp-" + std::to_string(::getpid());
  Spawned server(
      FERRY_BINARY,
      {"sync", "serve", "--address", address, "--receivers", "2", "--layers", "1", "--json"}, {});
  auto config = model::preset("qwen2.5-0.5b");
  ASSERT_TRUE(config.ok());
  config->num_layers = 1;
  const std::vector<TensorSpec> specs = model::hf_tensor_specs(*config, DType::kBF16);
  std::uint64_t model_bytes = 0;
  for (const TensorSpec& t : specs) model_bytes += t.bytes();

  std::vector<ferry::testing::CommandResult> results(2);
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.emplace_back([&, r] {
      results[r] = run_ferry({"sync", "recv", "--address", address, "--id", std::to_string(r),
                              "--tp", std::to_string(r) + "/2", "--layers", "1", "--json"});
    });
  }
  for (auto& t : ranks) t.join();
  std::vector<std::string> hashes;
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(results[r].exit_code, 0) << results[r].err;
    const auto got = nlohmann::json::parse(results[r].out);
    auto slices = convert::vllm_tp_slices(*config, specs, r, 2);
    ASSERT_TRUE(slices.ok());
    std::uint64_t selected = 0;
    for (const TensorSlice& s : *slices) selected += s.selected_bytes();
    EXPECT_EQ(got["bytes"].get<std::uint64_t>(), model_bytes);
    EXPECT_EQ(got["delivered_bytes"].get<std::uint64_t>(), selected) << "rank " << r;
    EXPECT_LT(selected, model_bytes * 51 / 100);
    hashes.push_back(got["content_hash"].get<std::string>());
  }
  EXPECT_NE(hashes[0], hashes[1]);  // two different halves
  EXPECT_EQ(server.wait(std::chrono::seconds(10)), 0);
}

// Parts of two different splits (1/2 and 2/3) leave tensors out: a rank's slices of those
// keep what they held, so the round is reported and then fails, counting what arrived.
TEST(RankLocalCli, PartsThatDoNotCoverTheModelFailTheRound) {
  const std::string base = "@ferry-cli-tp-gap-" + std::to_string(::getpid());
  const std::vector<std::string> addresses = {base + "-1", base + "-2"};
  const std::vector<std::string> parts = {"1/2", "2/3"};
  auto servers =
      spawn_part_servers(FERRY_BINARY, addresses, parts, {"--layers", "2", "--timeout", "30"});
  auto r = run_ferry({"sync", "recv", "--address", addresses[0], "--address", addresses[1], "--tp",
                      "0/2", "--layers", "2", "--timeout", "30", "--json"});
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_NE(r.err.find("tensors of qwen2.5-0.5b arrived from 2 sender(s) into --tp slices"),
            std::string::npos)
      << r.err;
  auto config = model::preset("qwen2.5-0.5b");
  ASSERT_TRUE(config.ok());
  config->num_layers = 2;
  const auto got = nlohmann::json::parse(r.out);  // the round is still reported
  EXPECT_LT(got["tensors"].get<std::size_t>(),
            model::hf_tensor_specs(*config, DType::kBF16).size());
  for (auto& server : servers) EXPECT_EQ(server->wait(std::chrono::seconds(10)), 0);
}

TEST(RankLocalCli, ARankOutsideTheGroupOrASizeThatDoesNotFitIsAUsageError) {
  auto outside = run_ferry({"sync", "recv", "--tp", "2/2"});
  EXPECT_EQ(outside.exit_code, 2);
  EXPECT_NE(outside.err.find("--tp '2/2': give R/N"), std::string::npos) << outside.err;
  auto three = run_ferry({"sync", "recv", "--tp", "0/3"});
  EXPECT_EQ(three.exit_code, 2);
  EXPECT_NE(three.err.find("size 3 does not divide the model's 14 attention heads"),
            std::string::npos)
      << three.err;
}

}  // namespace
}  // namespace ferry
