// Shard files as plain safetensors files (docs/checkpoint-format.md, "Shard files"): one
// tensor per slice, named after the global tensor with the slice's extent as its shape, so
// Hugging Face tools read them. The only place in checkpoint/ that reads or writes one.
#include <sys/stat.h>

#include <cstdio>
#include <map>

#include "checkpoint/format.h"
#include "checkpoint/shard_format.h"
#include "ferry/safetensors.h"

namespace ferry::checkpoint {
namespace {

// Whether the file's header puts `e` where the manifest puts slice `s` of `t`.
bool where_the_manifest_says(const SafetensorsHeader& h, const SafetensorsEntry* e,
                             const SavedTensor& t, const SavedSlice& s) {
  return e != nullptr && e->spec.dtype == t.dtype && e->spec.shape == s.extent &&
         h.data_offset + e->begin == s.data_offset && e->end - e->begin == s.bytes;
}

class SafetensorsShardReader final : public ShardReader {
 public:
  SafetensorsShardReader(std::string path, SafetensorsFile file)
      : path_(std::move(path)), file_(std::move(file)) {}

  Result<std::span<const std::byte>> slice(const SavedTensor& t,
                                           const SavedSlice& s) const override {
    const SafetensorsEntry* e = file_.header().find(s.tensor_in_file);
    if (!where_the_manifest_says(file_.header(), e, t, s)) {
      return corruption(path_ + ": tensor " + t.name +
                        " is not where the manifest puts it (dtype, shape or offset differ)");
    }
    return file_.view(*e).data;
  }

 private:
  const std::string path_;
  const SafetensorsFile file_;  // mapped
};

class SafetensorsShard final : public ShardFormat {
 public:
  std::string_view name() const override { return kDefaultShardFormat; }

  std::string file_name(int rank) const override {
    char buf[48];
    std::snprintf(buf, sizeof buf, "rank_%05d.safetensors", rank);
    return buf;
  }

  Result<WrittenShard> write(const std::string& dir, std::int64_t step, int rank,
                             std::span<const SliceView* const> slices,
                             const std::function<void(std::uint64_t)>& progress) const override {
    WrittenShard out;
    out.file.file = file_name(rank);
    out.file.rank = rank;
    const std::string path = dir + "/" + out.file.file;
    std::vector<TensorSpec> specs;
    for (const SliceView* v : slices)
      specs.push_back({v->spec.name, v->spec.dtype, v->spec.extent});
    // The header's __metadata__ (docs/checkpoint-format.md).
    const std::map<std::string, std::string> meta = {{"format", "pt"},
                                                     {"ferry.step", std::to_string(step)},
                                                     {"ferry.rank", std::to_string(rank)}};
    auto header = build_safetensors_header(specs, meta);
    if (!header.ok()) return header.status().with_context(path);
    auto writer = SafetensorsWriter::create(path, specs, meta);
    if (!writer.ok()) return writer.status();
    std::uint64_t at = header->size();
    for (const SliceView* v : slices) {
      if (Status s = writer->write(v->data); !s.ok()) return s;
      if (progress) progress(v->data.size());
      SavedTensor t{v->spec.name, v->spec.dtype, v->spec.global_shape, {}};
      t.slices.push_back({.rank = rank,
                          .file = out.file.file,
                          .tensor_in_file = v->spec.name,
                          .offset = v->spec.offset,
                          .extent = v->spec.extent,
                          .data_offset = at,
                          .bytes = v->data.size(),
                          .xxh3 = xxh3(v->data)});
      out.tensors.push_back(std::move(t));
      at += v->data.size();
    }
    if (Status s = writer->finish(); !s.ok()) return s;
    out.file.bytes = at;
    return out;
  }

  Result<std::shared_ptr<const ShardReader>> open(const std::string& path) const override {
    auto file = SafetensorsFile::open(path);
    if (!file.ok()) return file.status();
    return std::shared_ptr<const ShardReader>(
        std::make_shared<SafetensorsShardReader>(path, std::move(*file)));
  }

  ShardCheck verify(const std::string& path, const SavedFile& file,
                    std::span<const ManifestSlice> slices,
                    const std::function<void(std::uint64_t)>& progress) const override {
    ShardCheck out;
    struct stat st {};
    const std::uint64_t size =
        ::stat(path.c_str(), &st) == 0 ? static_cast<std::uint64_t>(st.st_size) : 0;
    if (size != file.bytes) {
      out.problems.push_back({"", "has " + std::to_string(size) + " bytes, the manifest says " +
                                      std::to_string(file.bytes)});
      for (const auto& [t, s] : slices) {
        if (s->data_offset + s->bytes > size) {
          out.problems.push_back({t->name, "truncated: the slice ends at byte " +
                                               std::to_string(s->data_offset + s->bytes) +
                                               " past the file's end"});
        }
      }
      return out;
    }
    auto opened = SafetensorsFile::open(path);
    if (!opened.ok()) {
      out.problems.push_back({"", opened.status().to_string()});
      return out;
    }
    for (const auto& [t, s] : slices) {
      const SafetensorsEntry* e = opened->header().find(s->tensor_in_file);
      if (!where_the_manifest_says(opened->header(), e, *t, *s)) {
        out.problems.push_back({t->name, "not where the manifest puts it"});
        continue;
      }
      const std::uint64_t got = xxh3(opened->view(*e).data);
      if (got != s->xxh3) {
        out.problems.push_back(
            {t->name, "XXH3 " + hex(got) + " does not match the manifest's " + hex(s->xxh3)});
      }
      ++out.slices_checked;
      out.bytes_checked += s->bytes;
      if (progress) progress(s->bytes);
    }
    return out;
  }
};

}  // namespace

Result<const ShardFormat*> shard_format_for(std::string_view name) {
  static const SafetensorsShard safetensors;
  if (name == safetensors.name()) return static_cast<const ShardFormat*>(&safetensors);
  return failed_precondition("shard format '" + std::string(name) +
                             "' is not known to this ferry (it reads " +
                             std::string(safetensors.name()) + ")");
}

}  // namespace ferry::checkpoint
