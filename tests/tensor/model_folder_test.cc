#include <gtest/gtest.h>

#include <filesystem>

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

// The error read_model_index gives for the two shards above indexed by `weight_map`
// (OK when it accepts them).
Status index_error(const std::string& weight_map) {
  TempDir dir;
  make_sharded(dir.path(), weight_map);
  return read_model_index(dir.path()).status();
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

TEST(ModelFolder, RejectsTensorMissingFromItsShard) {
  const Status missing = index_error(
      R"({"a":"s1.safetensors","b":"s1.safetensors","c":"s2.safetensors","d":"s2.safetensors"})");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.message().find("'d'"), std::string::npos);
}

TEST(ModelFolder, RejectsTensorInTheWrongShardOrNotIndexed) {
  const Status wrong =
      index_error(R"({"a":"s2.safetensors","b":"s1.safetensors","c":"s2.safetensors"})");
  ASSERT_FALSE(wrong.ok());
  EXPECT_NE(wrong.message().find("index.json says 's2.safetensors'"), std::string::npos)
      << wrong.message();

  const Status extra = index_error(R"({"a":"s1.safetensors","c":"s2.safetensors"})");
  ASSERT_FALSE(extra.ok());
  EXPECT_NE(extra.message().find("'b' is not in"), std::string::npos);
}

TEST(ModelFolder, RejectsMissingShardAndEscapingNames) {
  const Status missing =
      index_error(R"({"a":"s1.safetensors","b":"s1.safetensors","c":"s3.safetensors"})");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.code(), Code::kNotFound);
  EXPECT_NE(missing.message().find("s3.safetensors"), std::string::npos);

  const Status escape =
      index_error(R"({"a":"../s1.safetensors","b":"s1.safetensors","c":"s2.safetensors"})");
  ASSERT_FALSE(escape.ok());
  EXPECT_NE(escape.message().find("not a file name inside the folder"), std::string::npos);
}

TEST(ModelFolder, EmptyFolderIsNotFound) {
  TempDir dir;
  auto index = read_model_index(dir.path());
  ASSERT_FALSE(index.ok());
  EXPECT_EQ(index.status().code(), Code::kNotFound);
}

}  // namespace
}  // namespace ferry
