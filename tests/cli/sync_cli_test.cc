// ferry demo / sync / bench sync, run as a user would.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "support/test_support.h"

namespace ferry {
namespace {

using ferry::testing::run_ferry;

TEST(SyncCli, DemoStreamsATensorLargerThanTheBucketVerified) {
  // 4096 x 512 F32 = 8 MiB through a 1 MiB bucket, 3 rounds, 2 receiver processes.
  auto r = run_ferry({"demo", "--vocab", "4096", "--hidden", "512", "--bucket-mb", "1", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_TRUE(j["ok"].get<bool>());
  ASSERT_EQ(j["rounds"].size(), 3u);
  for (const auto& round : j["rounds"]) {
    EXPECT_EQ(round["receivers_verified"].get<int>(), 2);
    EXPECT_GT(round["buckets"].get<int>(), 8);
  }
}

// Backing memory moved out of round 1 into setup: the demo must say what setup took,
// apart from the rounds, and give round 1 against round 2 (issue 15 item 5).
TEST(SyncCli, DemoReportsSetupApartFromTheRoundsAndRound1AgainstRound2) {
  const std::vector<std::string> small = {"demo", "--vocab",     "1024", "--hidden",
                                          "256",  "--bucket-mb", "1"};
  auto args = small;
  args.push_back("--json");
  auto r = run_ferry(args);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_GT(j["setup_seconds"].get<double>(), 0.0);
  const double first = j["rounds"][0]["seconds"].get<double>();
  const double second = j["rounds"][1]["seconds"].get<double>();
  ASSERT_GT(second, 0.0);
  EXPECT_DOUBLE_EQ(j["round1_over_round2"].get<double>(), first / second);

  auto text = run_ferry(small);
  ASSERT_EQ(text.exit_code, 0) << text.err;
  const auto setup = text.out.find("setup ");
  const auto header = text.out.find("round  tensors");
  ASSERT_NE(setup, std::string::npos) << text.out;
  ASSERT_NE(header, std::string::npos) << text.out;
  EXPECT_LT(setup, header) << text.out;
  EXPECT_NE(text.out.find("round 1 took "), std::string::npos) << text.out;
}

TEST(SyncCli, BadBucketIsAUsageErrorNamingTheFlag) {
  auto r = run_ferry({"sync", "serve", "--address", "@ferry-cli-test-bad", "--bucket-mb", "0"});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("--bucket-mb"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("bucket_bytes"), std::string::npos) << r.err;
}

TEST(SyncCli, UnknownDeltaModeIsAUsageErrorNamingTheChoices) {
  auto r = run_ferry({"sync", "serve", "--address", "@ferry-cli-delta", "--delta", "yes"});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("--delta"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("off, on or auto"), std::string::npos) << r.err;
}

TEST(SyncCli, ListenWithoutAPortIsAUsageErrorAndLeavesNoSocketFile) {
  auto r = run_ferry({"sync", "serve", "--listen", "127.0.0.1", "--timeout", "1"});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("--listen"), std::string::npos) << r.err;
}

TEST(SyncCli, UnknownWireProtectIsAUsageErrorNamingTheChoices) {
  for (const char* role : {"serve", "recv"}) {
    auto r = run_ferry({"sync", role, "--address", "@ferry-cli-wire", "--wire-protect", "hmac"});
    EXPECT_EQ(r.exit_code, 2) << role << ": " << r.err;
    EXPECT_NE(r.err.find("--wire-protect: wire protection 'hmac' is not one of none, mac, encrypt"),
              std::string::npos)
        << r.err;
  }
  auto bench = run_ferry({"bench", "sync", "--net", "--wire-protect", "none,hmac"});
  EXPECT_EQ(bench.exit_code, 2) << bench.err;
  EXPECT_NE(bench.err.find("'hmac'"), std::string::npos) << bench.err;
}

TEST(SyncCli, ZeroRoundsOrReceiversAreUsageErrors) {
  EXPECT_EQ(run_ferry({"sync", "serve", "--address", "@ferry-cli-zero", "--rounds", "0"}).exit_code,
            2);
  EXPECT_EQ(
      run_ferry({"sync", "serve", "--address", "@ferry-cli-zero", "--receivers", "0"}).exit_code,
      2);
  EXPECT_EQ(run_ferry({"demo", "--rounds", "0"}).exit_code, 2);
  EXPECT_EQ(run_ferry({"demo", "--receivers", "0"}).exit_code, 2);
}

TEST(SyncCli, DemoDeltaSendsOnlyWhatChangedVerified) {
  auto r = run_ferry(
      {"demo", "--vocab", "1024", "--hidden", "256", "--bucket-mb", "1", "--delta", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_TRUE(j["ok"].get<bool>());
  ASSERT_EQ(j["rounds"].size(), 3u);
  EXPECT_FALSE(j["rounds"][0]["delta"].get<bool>());
  for (int i = 1; i < 3; ++i) {
    const auto& round = j["rounds"][i];
    EXPECT_TRUE(round["delta"].get<bool>());
    EXPECT_LT(round["wire_bytes"].get<std::uint64_t>() * 10, round["bytes"].get<std::uint64_t>());
  }
}

TEST(SyncCli, BenchDeltaDensityJsonAndBadDensity) {
  // --delta on: deltas on shm too, whatever changed.
  auto r =
      run_ferry({"bench", "sync", "--delta-density", "0.01,1.0", "--tensors", "4", "--tensor-bytes",
                 "262144", "--bucket-mb", "1", "--rounds", "1", "--delta", "on", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["delta_mode"], "on");
  ASSERT_EQ(j["results"].size(), 3u);  // two densities and the Adam step
  for (const auto& row : j["results"]) EXPECT_TRUE(row["delta"].get<bool>()) << row;
  EXPECT_GT(j["results"][0]["bytes_over_wire"].get<double>(), 10);
  EXPECT_GT(j["results"][0]["sender_extra_bytes"].get<std::uint64_t>(), 0u);
  // auto (the default) on shm alone: every round dense.
  auto automatic =
      run_ferry({"bench", "sync", "--delta-density", "0.01", "--tensors", "4", "--tensor-bytes",
                 "262144", "--bucket-mb", "1", "--rounds", "1", "--json"});
  ASSERT_EQ(automatic.exit_code, 0) << automatic.err;
  j = nlohmann::json::parse(automatic.out);
  EXPECT_EQ(j["delta_mode"], "auto");
  for (const auto& row : j["results"]) EXPECT_FALSE(row["delta"].get<bool>()) << row;
  auto bad = run_ferry({"bench", "sync", "--delta-density", "1.5"});
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.err.find("--delta-density 1.5"), std::string::npos) << bad.err;
  auto off = run_ferry({"bench", "sync", "--delta-density", "0.01", "--delta", "off"});
  EXPECT_NE(off.exit_code, 0);
  EXPECT_NE(off.err.find("--delta off"), std::string::npos) << off.err;
}

// Through a relay over TCP: the sender's link carries the dense bytes on the dense session and
// about the encoded bytes on the delta session.
TEST(SyncCli, BenchDeltaDensityNetCountsLinkBytes) {
  auto r =
      run_ferry({"bench", "sync", "--delta-density", "0.01,1.0", "--tensors", "4", "--tensor-bytes",
                 "262144", "--bucket-mb", "1", "--rounds", "1", "--net", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["mode"], "delta_net");
  ASSERT_EQ(j["results"].size(), 3u);  // two densities and the Adam step
  for (const auto& row : j["results"]) {
    // Every payload byte crossed the link, plus framing.
    EXPECT_GE(row["dense_link_bytes"].get<std::uint64_t>(), row["bytes"].get<std::uint64_t>());
    EXPECT_GE(row["delta_link_bytes"].get<std::uint64_t>(), row["wire_bytes"].get<std::uint64_t>());
  }
  const auto& sparse = j["results"][0];
  EXPECT_TRUE(sparse["delta"].get<bool>());
  EXPECT_GT(sparse["dense_over_delta_link"].get<double>(), 10);
  EXPECT_LT(j["results"][1]["dense_over_delta_link"].get<double>(), 1.1);  // auto went dense
}

TEST(SyncCli, BenchJsonHasTheDocumentedFields) {
  auto r = run_ferry({"bench", "sync", "--tensors", "16", "--tensor-bytes", "65536", "--bucket-mb",
                      "1", "--receivers", "1", "--rounds", "1", "--memcpy-mb", "16", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_GT(j["memcpy_gbps"].get<double>(), 0);
  ASSERT_EQ(j["results"].size(), 1u);
  for (const char* key : {"dtype", "bucket_mb", "receivers", "tensors", "bytes", "seconds", "gbps",
                          "ratio_to_memcpy", "peak_rss_bytes"}) {
    EXPECT_TRUE(j["results"][0].contains(key)) << key;
  }
  EXPECT_EQ(j["results"][0]["bytes"].get<std::uint64_t>(), 16u * 65536);
}

}  // namespace
}  // namespace ferry
