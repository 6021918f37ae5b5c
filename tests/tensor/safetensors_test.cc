#include "ferry/safetensors.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <numeric>

#include "support/status_matchers.h"
#include "support/test_support.h"

namespace ferry {
namespace {

using testing::TempDir;
using testing::write_bytes;

std::string le64(std::uint64_t n) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return s;
}

// A file from a literal JSON header and a data section of `data_bytes` bytes.
std::string file_with(const std::string& json, std::size_t data_bytes) {
  return le64(json.size()) + json + std::string(data_bytes, '\x7f');
}

// Parses `bytes` written to a file and returns the error message ("" if it parsed).
std::string error_of(const std::string& bytes) {
  TempDir dir;
  const std::string path = dir.file("bad.safetensors");
  write_bytes(path, bytes);
  auto header = read_safetensors_header(path);
  auto mapped = SafetensorsFile::open(path);
  // Header-only and mapped reads must agree.
  EXPECT_EQ(header.ok(), mapped.ok());
  if (header.ok()) return "";
  EXPECT_EQ(header.status().code(), mapped.status().code());
  return header.status().message();
}

const std::string kOne = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";

TEST(SafetensorsReader, AcceptsAValidFile) { EXPECT_EQ(error_of(file_with(kOne, 8)), ""); }

// A file the reader must refuse, and what its error must say.
struct Rejected {
  const char* name;  // the case in SafetensorsReader/RejectedFile.NamesWhatIsWrong/<name>
  std::string file;
  const char* error;
};

const Rejected kRejected[] = {
    {"FileShorterThanLengthPrefix", "abc", "too short"},
    {"TruncatedHeader", file_with(kOne, 8).substr(0, 20), "runs past the end"},
    {"TruncatedData", file_with(kOne, 5), "truncated"},
    {"OversizedHeaderLength", le64(kSafetensorsMaxHeaderBytes + 1) + "{}",
     "exceeds the format's limit"},
    {"JsonCutShort", file_with(R"({"a":{"dtype":"F32",)", 0), "not valid UTF-8 JSON"},
    {"JsonNotAnObject", file_with("[1,2]", 0), "does not start with '{'"},
    {"InvalidUtf8",
     file_with("{\"\xff\xfe\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1),
     "UTF-8"},
    {"ShapeThatDisagreesWithOffsets",
     file_with(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8), "needs 12 bytes"},
    {"OverlappingTensors",
     file_with(
         R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"b":{"dtype":"U8","shape":[4],"data_offsets":[2,6]}})",
         6),
     "overlaps"},
    {"Holes",
     file_with(
         R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},"b":{"dtype":"U8","shape":[2],"data_offsets":[4,6]}})",
         6),
     "hole"},
    {"TrailingBytes", file_with(kOne, 12), "trailing bytes"},
    {"OutOfRangeOffsets",
     file_with(R"({"a":{"dtype":"U8","shape":[100],"data_offsets":[0,100]}})", 10),
     "ends at data offset 100"},
    {"ReversedOffsets", file_with(R"({"a":{"dtype":"U8","shape":[0],"data_offsets":[8,0]}})", 8),
     "< begin"},
    {"DuplicateNames",
     file_with(
         R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})",
         2),
     "appears twice"},
    // Issue 15: inspect and ckpt save accepted a tensor named "", which the wire refuses later.
    {"AnEmptyTensorName", file_with(R"({"":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})", 1),
     "empty name"},
    {"NonStringMetadata", file_with(R"({"__metadata__":{"format":1}})", 0),
     "__metadata__['format']"},
    {"NegativeShape", file_with(R"({"a":{"dtype":"U8","shape":[-1],"data_offsets":[0,0]}})", 0),
     "not a non-negative integer"},
    {"MissingDataOffsets", file_with(R"({"a":{"dtype":"U8","shape":[1]}})", 1), "data_offsets"},
    {"UnknownField", file_with(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1],"x":1}})", 1),
     "unknown field 'x'"},
};

class RejectedFile : public ::testing::TestWithParam<Rejected> {};

TEST_P(RejectedFile, NamesWhatIsWrong) {
  const std::string e = error_of(GetParam().file);
  EXPECT_NE(e.find(GetParam().error), std::string::npos) << e;
}

INSTANTIATE_TEST_SUITE_P(SafetensorsReader, RejectedFile, ::testing::ValuesIn(kRejected),
                         [](const auto& c) { return std::string(c.param.name); });

TEST(SafetensorsReader, RejectsUnknownDtype) {
  const std::string json = R"({"a":{"dtype":"F31","shape":[2],"data_offsets":[0,8]}})";
  const std::string e = error_of(file_with(json, 8));
  EXPECT_NE(e.find("unknown dtype 'F31'"), std::string::npos) << e;
  EXPECT_NE(e.find("tensor 'a'"), std::string::npos);
  // A torch spelling is not a safetensors dtype.
  const std::string torchy = R"({"a":{"dtype":"float32","shape":[2],"data_offsets":[0,8]}})";
  EXPECT_NE(error_of(file_with(torchy, 8)).find("unknown dtype"), std::string::npos);
}

TEST(SafetensorsReader, AcceptsEmptyTensorsAndEmptyFile) {
  EXPECT_EQ(error_of(file_with("{}", 0)), "");
  EXPECT_EQ(error_of(file_with(R"({"e":{"dtype":"F16","shape":[0,5],"data_offsets":[0,0]}})", 0)),
            "");
}

TEST(SafetensorsWriter, RoundTripsTensorsWithMetadataAndAlignment) {
  TempDir dir;
  const std::string path = dir.file("m.safetensors");
  std::vector<TensorSpec> specs = {
      {"w", DType::kBF16, {3, 5}}, {"b", DType::kF32, {7}}, {"i", DType::kI8, {3}}};
  std::vector<std::vector<std::byte>> data;
  for (const TensorSpec& s : specs) {
    std::vector<std::byte> d(s.bytes());
    for (std::size_t i = 0; i < d.size(); ++i) d[i] = static_cast<std::byte>(i * 7 + s.name[0]);
    data.push_back(std::move(d));
  }
  auto w = SafetensorsWriter::create(path, specs, {{"format", "pt"}});
  ASSERT_OK(w);
  ASSERT_OK(w->write_tensor({specs[0], data[0]}));
  // The second tensor arrives in pieces of odd sizes.
  ASSERT_OK(w->write(std::span(data[1]).first(5)));
  ASSERT_OK(w->write(std::span(data[1]).subspan(5)));
  ASSERT_OK(w->write_tensor({specs[2], data[2]}));
  EXPECT_FALSE(std::filesystem::exists(path)) << "visible before finish()";
  ASSERT_OK(w->finish());

  auto f = SafetensorsFile::open(path);
  ASSERT_OK(f);
  EXPECT_EQ(f->header().data_offset % 8, 0u);
  EXPECT_EQ(f->header().metadata.at("format"), "pt");
  for (std::size_t i = 0; i < specs.size(); ++i) {
    auto v = f->view(specs[i].name);
    ASSERT_OK(v);
    EXPECT_EQ(v->spec, specs[i]);
    EXPECT_TRUE(std::equal(v->data.begin(), v->data.end(), data[i].begin(), data[i].end()));
  }
  EXPECT_EQ(f->view("nope").status().code(), Code::kNotFound);
}

TEST(SafetensorsWriter, UnfinishedWriterLeavesNothing) {
  TempDir dir;
  const std::string path = dir.file("partial.safetensors");
  {
    auto w = SafetensorsWriter::create(path, {{"w", DType::kU8, {10}}});
    ASSERT_OK(w);
    std::vector<std::byte> five(5);
    ASSERT_OK(w->write(five));
    EXPECT_EQ(w->finish().code(), Code::kFailedPrecondition);
  }
  EXPECT_TRUE(std::filesystem::is_empty(dir.path())) << "temporary file left behind";
}

TEST(SafetensorsWriter, RejectsTooManyBytesAndOutOfOrderTensors) {
  TempDir dir;
  auto w = SafetensorsWriter::create(dir.file("x.safetensors"),
                                     {{"a", DType::kU8, {2}}, {"b", DType::kU8, {2}}});
  ASSERT_OK(w);
  std::vector<std::byte> two(2), five(5);
  EXPECT_FALSE(w->write_tensor({{"b", DType::kU8, {2}}, two}).ok());
  EXPECT_EQ(w->write(five).code(), Code::kInvalidArgument);
  EXPECT_FALSE(
      SafetensorsWriter::create(dir.file("y"), {{"a", DType::kU8, {1}}, {"a", DType::kU8, {1}}})
          .ok());
}

}  // namespace
}  // namespace ferry
