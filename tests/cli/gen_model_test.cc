#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "ferry/model.h"
#include "ferry/safetensors.h"
#include "support/status_matchers.h"
#include "support/test_support.h"

namespace ferry {
namespace {

using testing::run_ferry;
using testing::TempDir;

// The foundation issue's acceptance check: a Qwen2.5-7B folder with 2 layers
// (about 3.1 GB in bf16) reads back bit-exact, and inspect --json reports it.
TEST(GenModelCli, Qwen7bTwoLayersReadsBackBitExact) {
  TempDir dir;
  const std::string out = dir.file("qwen7b");
  auto gen = run_ferry({"gen-model", "--preset", "qwen2.5-7b", "--layers", "2", "--dtype", "bf16",
                        "--seed", "11", "--max-shard-gb", "1", "--out", out});
  ASSERT_EQ(gen.exit_code, 0) << gen.err;

  auto folder = ModelFolder::open(out);
  ASSERT_OK(folder);
  auto config = model::preset("qwen2.5-7b");
  config->num_layers = 2;
  const auto specs = model::hf_tensor_specs(*config, DType::kBF16);
  ASSERT_EQ(folder->index().tensors.size(), specs.size());
  std::vector<std::byte> expected;
  for (const TensorSpec& spec : specs) {
    auto view = folder->view(spec.name);
    ASSERT_OK(view) << spec.name;
    EXPECT_EQ(view->spec, spec);
    expected.resize(spec.bytes());
    model::fill_synthetic(11, spec.name, 0, expected);
    EXPECT_EQ(testing::hash_bytes(view->data), testing::hash_bytes(expected)) << spec.name;
  }

  auto inspect = run_ferry({"inspect", "--json", out});
  ASSERT_EQ(inspect.exit_code, 0) << inspect.err;
  auto j = nlohmann::json::parse(inspect.out);
  EXPECT_EQ(j["tensor_count"], specs.size());
  EXPECT_GT(j["files"].size(), 1u);  // sharded through model.safetensors.index.json
  EXPECT_EQ(j["tensors"][0]["name"], specs[0].name);
}

TEST(GenModelCli, RefusesToOverwriteWithoutForceAndRejectsBadFlags) {
  TempDir dir;
  testing::write_bytes(dir.file("keep.txt"), "user data");
  auto r = run_ferry({"gen-model", "--preset", "qwen3-0.6b", "--layers", "1", "--out", dir.path()});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("--force"), std::string::npos);
  EXPECT_EQ(run_ferry({"gen-model", "--preset", "nope", "--out", dir.file("x")}).exit_code, 2);
  EXPECT_EQ(
      run_ferry({"gen-model", "--preset", "qwen3-0.6b", "--dtype", "int8", "--out", dir.file("x")})
          .exit_code,
      2);
}

TEST(GenModelCli, LayersOutsideThePresetAreUsageErrors) {
  TempDir dir;
  for (const char* layers : {"-1", "0", "999"}) {
    auto r = run_ferry({"gen-model", "--preset", "qwen3-0.6b", "--layers", layers, "--out",
                        dir.file(std::string("x") + layers)});
    EXPECT_EQ(r.exit_code, 2) << layers << ": " << r.err;
    EXPECT_NE(r.err.find("--layers"), std::string::npos) << r.err;
  }
}

TEST(InspectCli, NamesTheProblemInACorruptFile) {
  TempDir dir;
  testing::write_bytes(dir.file("bad.safetensors"), std::string("\x10\0\0\0\0\0\0\0{", 9));
  auto r = run_ferry({"inspect", dir.file("bad.safetensors")});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("bad.safetensors"), std::string::npos);
  EXPECT_NE(r.err.find("runs past the end"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace ferry
