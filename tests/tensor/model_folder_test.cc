#include <gtest/gtest.h>

#include <filesystem>
#include <optional>

#include "ferry/safetensors.h"
#include "support/status_matchers.h"
#include "support/test_support.h"

namespace ferry {
namespace {

using testing::TempDir;
using testing::write_bytes;

// Two shards "s1" {a, b} and "s2" {c}, with an index describing them.
void make_sharded(const std::string& dir, const std::string& weight_map) {
  auto write = [&](const std::string& file, std::vector<TensorSpec> specs) {
    auto w = SafetensorsWriter::create(dir + "/" + file, specs);
    ASSERT_OK(w);
    for (const TensorSpec& s : specs) {
      std::vector<std::byte> d(s.bytes(), std::byte{1});
      ASSERT_OK(w->write(d));
    }
    ASSERT_OK(w->finish());
  };
  write("s1.safetensors", {{"a", DType::kF32, {2}}, {"b", DType::kF16, {4}}});
  write("s2.safetensors", {{"c", DType::kBF16, {3}}});
  write_bytes(dir + "/model.safetensors.index.json",
              R"({"metadata":{"total_size":22},"weight_map":)" + weight_map + "}");
}

TEST(ModelFolder, ReadsShardedFolderThroughIndex) {
  TempDir dir;
  make_sharded(dir.path(), R"({"a":"s1.safetensors","b":"s1.safetensors","c":"s2.safetensors"})");
  auto index = read_model_index(dir.path());
  ASSERT_OK(index);
  ASSERT_EQ(index->tensors.size(), 3u);
  EXPECT_EQ(index->files.size(), 2u);
  auto folder = ModelFolder::open(dir.path());
  ASSERT_OK(folder);
  auto c = folder->view("c");
  ASSERT_OK(c);
  EXPECT_EQ(c->spec.shape, std::vector<std::int64_t>{3});
}

// An index over the two shards above that read_model_index must refuse, and what its
// error must say.
struct BadIndex {
  const char* name;  // the case in ModelFolder/RejectedIndex.NamesWhatIsWrong/<name>
  const char* weight_map;
  const char* error;
  std::optional<Code> code = std::nullopt;
};

const BadIndex kBadIndexes[] = {
    {"TensorMissingFromItsShard",
     R"({"a":"s1.safetensors","b":"s1.safetensors","c":"s2.safetensors","d":"s2.safetensors"})",
     "'d'"},
    {"TensorInTheWrongShard", R"({"a":"s2.safetensors","b":"s1.safetensors","c":"s2.safetensors"})",
     "index.json says 's2.safetensors'"},
    {"TensorNotIndexed", R"({"a":"s1.safetensors","c":"s2.safetensors"})", "'b' is not in"},
    {"MissingShard", R"({"a":"s1.safetensors","b":"s1.safetensors","c":"s3.safetensors"})",
     "s3.safetensors", Code::kNotFound},
    {"EscapingName", R"({"a":"../s1.safetensors","b":"s1.safetensors","c":"s2.safetensors"})",
     "not a file name inside the folder"},
};

class RejectedIndex : public ::testing::TestWithParam<BadIndex> {};

TEST_P(RejectedIndex, NamesWhatIsWrong) {
  TempDir dir;
  make_sharded(dir.path(), GetParam().weight_map);
  const Status s = read_model_index(dir.path()).status();
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find(GetParam().error), std::string::npos) << s.message();
  if (GetParam().code) {
    EXPECT_EQ(s.code(), *GetParam().code) << s.to_string();
  }
}

INSTANTIATE_TEST_SUITE_P(ModelFolder, RejectedIndex, ::testing::ValuesIn(kBadIndexes),
                         [](const auto& c) { return std::string(c.param.name); });

TEST(ModelFolder, EmptyFolderIsNotFound) {
  TempDir dir;
  auto index = read_model_index(dir.path());
  ASSERT_FALSE(index.ok());
  EXPECT_EQ(index.status().code(), Code::kNotFound);
}

}  // namespace
}  // namespace ferry
