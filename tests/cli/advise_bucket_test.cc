#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "support/test_support.h"

namespace ferry {
namespace {

using testing::run_ferry;

TEST(AdviseBucketCli, FaqShapePrintsBucketAndOverrideLine) {
  auto r = run_ferry({"advise-bucket", "--shape", "151936x4096", "--dtype", "float32"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("4096 MiB"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(
                "actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes=4096"),
            std::string::npos);
  EXPECT_NE(r.out.find("ferry's own engine needs no such setting"), std::string::npos);
}

TEST(AdviseBucketCli, JsonGivesTheNumbers) {
  auto r =
      run_ferry({"advise-bucket", "--shape", "152064x8192", "--dtype", "torch.float32", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["bucket_mb"], 8192);
  EXPECT_EQ(j["bytes"], 152064ULL * 8192 * 4);
}

TEST(AdviseBucketCli, UsageErrorsExitTwoAndSayWhy) {
  auto r = run_ferry({"advise-bucket", "--shape", "12xfoo"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--shape '12xfoo'"), std::string::npos) << r.err;
  auto none = run_ferry({"advise-bucket"});
  EXPECT_EQ(none.exit_code, 2);
  auto unknown = run_ferry({"advise-bucket", "--bogus"});
  EXPECT_EQ(unknown.exit_code, 2);
}

TEST(Cli, HelpShowsAnExampleAndUnknownCommandIsUsageError) {
  auto help = run_ferry({"advise-bucket", "--help"});
  EXPECT_EQ(help.exit_code, 0);
  EXPECT_NE(help.out.find("Example:"), std::string::npos);
  EXPECT_EQ(run_ferry({"no-such-command"}).exit_code, 2);
  EXPECT_EQ(run_ferry({}).exit_code, 2);
}

}  // namespace
}  // namespace ferry
