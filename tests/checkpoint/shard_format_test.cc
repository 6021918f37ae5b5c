// The ShardFormat interface (src/checkpoint/shard_format.h) through its safetensors
// implementation: a shard written, read back bit-exact and verified; a flipped byte and a
// slice out of place named with their tensor and file; the manifest's "shard_format".
#include "checkpoint/shard_format.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "checkpoint/format.h"
#include "ferry/checkpoint_tools.h"
#include "support/status_matchers.h"
#include "support/test_support.h"

namespace ferry::checkpoint {
namespace {

namespace fs = std::filesystem;

struct OwnedSlice {
  SliceSpec spec;
  std::vector<std::byte> data;
};

OwnedSlice make_slice(SliceSpec spec, int seed) {
  OwnedSlice s{std::move(spec), {}};
  s.data.resize(s.spec.bytes());
  for (std::size_t i = 0; i < s.data.size(); ++i) {
    s.data[i] = static_cast<std::byte>((i * 11 + static_cast<std::size_t>(seed)) & 0xff);
  }
  return s;
}

void flip_byte(const std::string& path, std::uint64_t at) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(static_cast<std::streamoff>(at));
  char c = 0;
  f.read(&c, 1);
  c = static_cast<char>(c ^ 0x40);
  f.seekp(static_cast<std::streamoff>(at));
  f.write(&c, 1);
}

const ShardFormat& safetensors() {
  auto f = shard_format_for("safetensors");
  EXPECT_OK(f);
  return **f;
}

// Two slices of rank 2 written to a shard in a fresh folder.
struct Written {
  testing::TempDir dir;
  std::vector<OwnedSlice> slices;
  WrittenShard shard;
  std::uint64_t progressed = 0;
  std::string path() const { return dir.path() + "/" + shard.file.file; }
};

void write_two(Written* w) {
  w->slices.push_back(make_slice(SliceSpec::along("w", DType::kF32, {4, 3}, 0, 1, 3), 1));
  w->slices.push_back(make_slice(SliceSpec::whole("b", DType::kBF16, {5}), 2));
  std::vector<SliceView> views;
  for (const OwnedSlice& s : w->slices) views.push_back({s.spec, s.data});
  std::vector<const SliceView*> ptrs;
  for (const SliceView& v : views) ptrs.push_back(&v);
  auto shard = safetensors().write(w->dir.path(), 7, 2, ptrs,
                                   [&](std::uint64_t bytes) { w->progressed += bytes; });
  ASSERT_OK(shard);
  w->shard = std::move(*shard);
}

std::vector<ManifestSlice> entries(const WrittenShard& shard) {
  std::vector<ManifestSlice> out;
  for (const SavedTensor& t : shard.tensors) out.push_back({&t, &t.slices.front()});
  return out;
}

TEST(ShardFormat, SafetensorsWritesReadsBackBitExactAndVerifies) {
  Written w;
  write_two(&w);
  EXPECT_EQ(safetensors().name(), "safetensors");
  EXPECT_EQ(w.shard.file.file, "rank_00002.safetensors");
  EXPECT_EQ(w.shard.file.file, safetensors().file_name(2));
  EXPECT_EQ(w.shard.file.rank, 2);
  EXPECT_EQ(w.shard.file.bytes, fs::file_size(w.path()));
  EXPECT_EQ(w.progressed, 36u + 10u);
  ASSERT_EQ(w.shard.tensors.size(), 2u);
  for (std::size_t i = 0; i < 2; ++i) {
    const SavedTensor& t = w.shard.tensors[i];
    const OwnedSlice& want = w.slices[i];
    EXPECT_EQ(t.name, want.spec.name);
    EXPECT_EQ(t.dtype, want.spec.dtype);
    EXPECT_EQ(t.shape, want.spec.global_shape);
    ASSERT_EQ(t.slices.size(), 1u);
    const SavedSlice& s = t.slices[0];
    EXPECT_EQ(s.rank, 2);
    EXPECT_EQ(s.file, "rank_00002.safetensors");
    EXPECT_EQ(s.tensor_in_file, want.spec.name);
    EXPECT_EQ(s.offset, want.spec.offset);
    EXPECT_EQ(s.extent, want.spec.extent);
    EXPECT_EQ(s.bytes, want.data.size());
    EXPECT_EQ(s.xxh3, xxh3(want.data));
  }
  // The header lies before the data, slices in the order given.
  EXPECT_EQ(w.shard.tensors[1].slices[0].data_offset,
            w.shard.tensors[0].slices[0].data_offset + 36);
  EXPECT_EQ(w.shard.file.bytes, w.shard.tensors[1].slices[0].data_offset + 10);

  auto reader = safetensors().open(w.path());
  ASSERT_OK(reader);
  for (std::size_t i = 0; i < 2; ++i) {
    const SavedTensor& t = w.shard.tensors[i];
    auto bytes = (*reader)->slice(t, t.slices[0]);
    ASSERT_OK(bytes);
    EXPECT_TRUE(std::vector<std::byte>(bytes->begin(), bytes->end()) == w.slices[i].data) << t.name;
  }

  std::uint64_t checked = 0;
  const ShardCheck check = safetensors().verify(w.path(), w.shard.file, entries(w.shard),
                                                [&](std::uint64_t b) { checked += b; });
  EXPECT_TRUE(check.problems.empty()) << check.problems.front().message;
  EXPECT_EQ(check.slices_checked, 2u);
  EXPECT_EQ(check.bytes_checked, 46u);
  EXPECT_EQ(checked, 46u);
}

TEST(ShardFormat, SafetensorsVerifyNamesTheTensorOfAFlippedByte) {
  Written w;
  write_two(&w);
  const SavedSlice& b = w.shard.tensors[1].slices[0];
  flip_byte(w.path(), b.data_offset + 3);
  const ShardCheck check = safetensors().verify(w.path(), w.shard.file, entries(w.shard), {});
  ASSERT_EQ(check.problems.size(), 1u);
  EXPECT_EQ(check.problems[0].tensor, "b");
  EXPECT_NE(check.problems[0].message.find("does not match the manifest's " + hex(b.xxh3)),
            std::string::npos)
      << check.problems[0].message;
  EXPECT_EQ(check.slices_checked, 2u);  // "w" was checked too, and matched

  // A file of another size: named as the file's problem, with what it cut off.
  fs::resize_file(w.path(), b.data_offset + 4);
  const ShardCheck cut = safetensors().verify(w.path(), w.shard.file, entries(w.shard), {});
  ASSERT_EQ(cut.problems.size(), 2u);
  EXPECT_EQ(cut.problems[0].tensor, "");
  EXPECT_NE(cut.problems[0].message.find("the manifest says " + std::to_string(w.shard.file.bytes)),
            std::string::npos)
      << cut.problems[0].message;
  EXPECT_EQ(cut.problems[1].tensor, "b");
}

TEST(ShardFormat, SafetensorsReaderRefusesASliceNotWhereTheManifestPutsIt) {
  Written w;
  write_two(&w);
  auto reader = safetensors().open(w.path());
  ASSERT_OK(reader);
  SavedTensor t = w.shard.tensors[0];
  t.slices[0].data_offset += 4;
  auto moved = (*reader)->slice(t, t.slices[0]);
  EXPECT_EQ(moved.status().code(), Code::kCorruption);
  EXPECT_NE(
      moved.status().message().find(w.path() + ": tensor w is not where the manifest puts it"),
      std::string::npos)
      << moved.status().to_string();
  auto missing = safetensors().open(w.dir.path() + "/rank_00009.safetensors");
  EXPECT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("rank_00009.safetensors"), std::string::npos)
      << missing.status().to_string();
}

// Through `ferry ckpt verify`'s function: the flipped byte is named with its file and tensor.
TEST(ShardFormat, CheckpointVerifyNamesTheFileAndTensorOfAFlippedByte) {
  testing::TempDir tmp;
  fs::copy(std::string(FERRY_SOURCE_DIR) + "/tests/checkpoint/testdata/golden_v1", tmp.path(),
           fs::copy_options::recursive);
  auto m = format::read_manifest(tmp.path() + "/n1", 5);
  ASSERT_OK(m);
  const SavedTensor* t = m->find("b.bias");
  ASSERT_NE(t, nullptr);
  const SavedSlice& s = t->slices[1];
  ASSERT_EQ(s.file, "rank_00001.safetensors");
  const std::string path = tmp.path() + "/n1/step_5/" + s.file;
  flip_byte(path, s.data_offset);
  auto report = verify({tmp.path() + "/n0", tmp.path() + "/n1"});
  ASSERT_OK(report);
  ASSERT_EQ(report->problems.size(), 1u);
  EXPECT_EQ(report->problems[0].node, "n1");
  EXPECT_EQ(report->problems[0].file, path);
  EXPECT_EQ(report->problems[0].tensor, "b.bias");
  EXPECT_NE(report->problems[0].message.find("XXH3"), std::string::npos);
  EXPECT_EQ(report->slices_checked, 7u);
}

TEST(ShardFormat, TheManifestNamesItsFormatOnlyWhenNotSafetensors) {
  EXPECT_EQ(shard_format_for("npz").status().code(), Code::kFailedPrecondition);
  EXPECT_NE(shard_format_for("npz").status().message().find("'npz'"), std::string::npos);

  Manifest m;
  m.step = 1;
  m.layout = {1, 1, {"n0"}, {"n0"}};
  m.files = {{"rank_00000.safetensors", 0, "n0", 8}};
  const std::string text = format::encode_manifest(m);
  EXPECT_EQ(text.find("shard_format"), std::string::npos) << text;  // as before formats had names
  auto back = format::decode_manifest(text, "manifest.json");
  ASSERT_OK(back);
  EXPECT_EQ(back->shard_format, "safetensors");

  m.shard_format = "npz";
  const std::string other = format::encode_manifest(m);
  EXPECT_NE(other.find(R"("shard_format": "npz")"), std::string::npos) << other;
  auto refused = format::decode_manifest(other, "manifest.json");
  EXPECT_EQ(refused.status().code(), Code::kFailedPrecondition);
  EXPECT_NE(refused.status().message().find("manifest.json"), std::string::npos);
  EXPECT_NE(refused.status().message().find("'npz'"), std::string::npos);
}

}  // namespace
}  // namespace ferry::checkpoint
