// Whole-folder conversions, HF <-> Megatron, checked first and streamed from the mapped input.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>

#include "base/atomic_file.h"
#include "base/file_util.h"
#include "base/status_macros.h"
#include "convert/folder_io.h"
#include "ferry/convert.h"
#include "ferry/safetensors.h"

namespace ferry::convert {
namespace fs = std::filesystem;

Status StagedWriter::add(std::span<const std::byte> data) {
  if (buffer_.size() + data.size() > capacity_) {
    FERRY_RETURN_IF_ERROR(flush());
  }
  if (data.size() >= capacity_) return writer_->write(data);
  buffer_.insert(buffer_.end(), data.begin(), data.end());
  return ok_status();
}

Status StagedWriter::zeros(std::uint64_t bytes) {
  static const std::vector<std::byte> kZeros(1 << 20);
  while (bytes > 0) {
    const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(bytes, kZeros.size()));
    FERRY_RETURN_IF_ERROR(add({kZeros.data(), n}));
    bytes -= n;
  }
  return ok_status();
}

Status StagedWriter::flush() {
  if (buffer_.empty()) return ok_status();
  Status s = writer_->write(buffer_);
  buffer_.clear();
  return s;
}

namespace {

Result<model::ModelConfig> read_config(const std::string& folder) {
  const std::string path = folder + "/config.json";
  auto text = read_file(path);
  if (!text.ok()) {
    return not_found(path + " is missing: shapes are checked against the model's config.json");
  }
  return model::parse_hf_config(*text, path);
}

// A model's dtype: that of its embedding (every tensor is then checked against it).
DType model_dtype(const std::vector<TensorSpec>& found) {
  for (const TensorSpec& t : found) {
    if (t.name == "model.embed_tokens.weight" || t.name == "embedding.word_embeddings.weight") {
      return t.dtype;
    }
  }
  return found.empty() ? DType::kBF16 : found.front().dtype;
}

Status prepare_destination(const std::string& dst, bool overwrite) {
  std::error_code ec;
  if (fs::exists(dst, ec) && !fs::is_empty(dst, ec) && !overwrite) {
    return already_exists(dst +
                          " exists and is not empty (pass overwrite / --force to write into it)");
  }
  fs::create_directories(dst, ec);
  if (ec) return io_error("create folder " + dst + ": " + ec.message());
  return ok_status();
}

// config.json, tokenizer files and the like travel with the weights.
Status copy_side_files(const std::string& src, const std::string& dst) {
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(src, ec)) {
    if (!entry.is_regular_file()) continue;
    const std::string name = entry.path().filename().string();
    if (name.ends_with(".safetensors") || name == "model.safetensors.index.json" ||
        name == kLayoutFileName) {
      continue;
    }
    auto text = read_file(entry.path().string());
    if (!text.ok()) return text.status();
    FERRY_RETURN_IF_ERROR(write_file_atomic(dst + "/" + name, *text));
  }
  if (ec) return io_error("list folder " + src + ": " + ec.message());
  return ok_status();
}

struct HfSource {
  ModelFolder folder;
  std::vector<TensorSpec> found;
  Mapping mapping;
};

Result<HfSource> open_hf(const std::string& src, const MegatronLayout& layout) {
  auto config = read_config(src);
  if (!config.ok()) return config.status();
  auto folder = ModelFolder::open(src);
  if (!folder.ok()) return folder.status();
  std::vector<TensorSpec> found;
  for (const ModelTensor& t : folder->index().tensors) found.push_back(t.entry.spec);
  auto mapping = build_mapping(*config, layout, model_dtype(found));
  if (!mapping.ok()) return mapping.status().with_context(src + "/config.json");
  return HfSource{std::move(*folder), std::move(found), std::move(*mapping)};
}

struct MegatronSource {
  MegatronFolderInfo info;
  std::vector<SafetensorsFile> ranks;
  Mapping mapping;
};

Result<MegatronSource> open_megatron(const std::string& src) {
  auto info = read_megatron_layout(src);
  if (!info.ok()) return info.status();
  auto config = read_config(src);
  if (!config.ok()) return config.status();
  auto mapping = build_mapping(*config, info->layout, info->dtype);
  if (!mapping.ok()) return mapping.status().with_context(src);
  std::vector<SafetensorsFile> ranks;
  for (const std::string& f : info->rank_files) {
    auto file = SafetensorsFile::open(src + "/" + f);
    if (!file.ok()) return file.status();
    ranks.push_back(std::move(*file));
  }
  return MegatronSource{std::move(*info), std::move(ranks), std::move(*mapping)};
}

std::vector<CheckReport> check_ranks(const MegatronSource& m, const std::string& src) {
  std::vector<CheckReport> reports;
  for (std::size_t r = 0; r < m.ranks.size(); ++r) {
    std::vector<TensorSpec> found;
    for (const SafetensorsEntry& e : m.ranks[r].tensors()) found.push_back(e.spec);
    reports.push_back(
        check_tensors(m.mapping, Side::kMegatron, found, src + "/" + m.info.rank_files[r]));
  }
  return reports;
}

// One error for all reports; ranks with the same problems are named once.
Status combine(const std::vector<CheckReport>& reports) {
  std::vector<const CheckReport*> bad;
  for (const CheckReport& r : reports) {
    if (!r.ok()) bad.push_back(&r);
  }
  if (bad.empty()) return ok_status();
  std::string message;
  bool missing = false;
  std::map<std::string, std::vector<std::string>> by_body;  // report text without source
  std::vector<std::string> order;
  for (const CheckReport* r : bad) {
    CheckReport anonymous = *r;
    anonymous.source.clear();
    const std::string body = anonymous.to_string();
    if (!by_body.contains(body)) order.push_back(body);
    by_body[body].push_back(r->source);
    missing = missing || !r->missing.empty();
  }
  for (const std::string& body : order) {
    const auto& sources = by_body[body];
    std::string who = sources.front();
    if (sources.size() > 1) who += " (and " + std::to_string(sources.size() - 1) + " more ranks)";
    if (!message.empty()) message += "\n";
    message += who + body.substr(std::string("tensors").size());
  }
  return missing ? not_found(message) : failed_precondition(message);
}

std::string hf_shard_name(std::size_t i, std::size_t n) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "model-%05zu-of-%05zu.safetensors", i + 1, n);
  return buf;
}

// Shard-side sources of one HF tensor's bytes: (rank, shard byte offset, HF offset, bytes).
struct Block {
  std::uint64_t hf_offset;
  std::uint64_t shard_offset;
  std::uint64_t bytes;
  int rank;
};

}  // namespace

Result<std::vector<CheckReport>> check_hf_folder(const std::string& src,
                                                 const MegatronLayout& layout) {
  auto hf = open_hf(src, layout);
  if (!hf.ok()) return hf.status();
  return std::vector<CheckReport>{check_tensors(hf->mapping, Side::kHf, hf->found, src)};
}

Result<std::vector<CheckReport>> check_megatron_folder(const std::string& src) {
  auto m = open_megatron(src);
  if (!m.ok()) return m.status();
  return check_ranks(*m, src);
}

Result<ConvertSummary> hf_to_megatron(const std::string& src, const std::string& dst,
                                      const ConvertOptions& options) {
  auto hf = open_hf(src, options.layout);
  if (!hf.ok()) return hf.status();
  const Mapping& m = hf->mapping;
  FERRY_RETURN_IF_ERROR(check_tensors(m, Side::kHf, hf->found, src).to_status());
  FERRY_RETURN_IF_ERROR(prepare_destination(dst, options.overwrite));

  // Views of every HF tensor, by mapping index (check_tensors proved each exists).
  std::vector<TensorView> views(m.hf_tensors.size());
  for (std::size_t i = 0; i < m.hf_tensors.size(); ++i) {
    auto v = hf->folder.view(m.hf_tensors[i].name);
    if (!v.ok()) return v.status();
    views[i] = *v;
  }
  const std::vector<TensorSpec> shard_specs = m.shard_specs();
  std::uint64_t per_rank = 0;
  for (const TensorSpec& s : shard_specs) per_rank += s.bytes();
  const std::uint64_t total = per_rank * static_cast<std::uint64_t>(m.layout.tp);

  ConvertSummary summary;
  summary.tensors_in = hf->found.size();
  std::uint64_t done = 0;
  for (int r = 0; r < m.layout.tp; ++r) {
    const std::string file = rank_file_name(r);
    std::error_code ec;
    fs::create_directories(fs::path(dst + "/" + file).parent_path(), ec);
    if (ec) return io_error("create folder for " + dst + "/" + file + ": " + ec.message());
    auto writer = SafetensorsWriter::create(dst + "/" + file, shard_specs,
                                            {{"format", "pt"},
                                             {"ferry.tp_rank", std::to_string(r)},
                                             {"ferry.tp", std::to_string(m.layout.tp)}});
    if (!writer.ok()) return writer.status();
    StagedWriter out(&*writer);
    for (const MegatronParam& p : m.params) {
      for (const Run& run : shard_runs(m, p, r)) {
        if (run.source == Run::kZeros) {
          FERRY_RETURN_IF_ERROR(out.zeros(run.bytes()));
          continue;
        }
        const TensorView& v = views[static_cast<std::size_t>(m.find_hf(p.hf_names[run.source]))];
        for (std::uint64_t b = 0; b < run.count; ++b) {
          if (Status s =
                  out.add(v.data.subspan(run.hf_offset + b * run.hf_stride, run.block_bytes));
              !s.ok()) {
            return s;
          }
        }
      }
      done += m.shard_spec(p).bytes();
      if (options.progress) options.progress(done, total);
    }
    FERRY_RETURN_IF_ERROR(out.flush());
    FERRY_RETURN_IF_ERROR(writer->finish());
    summary.files.push_back(file);
  }
  summary.tensors_out = shard_specs.size() * static_cast<std::size_t>(m.layout.tp);
  summary.bytes_out = total;
  FERRY_RETURN_IF_ERROR(copy_side_files(src, dst));
  // Written last: a folder without it is an unfinished conversion.
  if (Status s = write_file_atomic(dst + "/" + std::string(kLayoutFileName),
                                   megatron_layout_json(m.layout, m.dtype));
      !s.ok()) {
    return s;
  }
  return summary;
}

Result<ConvertSummary> megatron_to_hf(const std::string& src, const std::string& dst,
                                      const ConvertOptions& options) {
  auto ms = open_megatron(src);
  if (!ms.ok()) return ms.status();
  const Mapping& m = ms->mapping;
  FERRY_RETURN_IF_ERROR(combine(check_ranks(*ms, src)));
  FERRY_RETURN_IF_ERROR(prepare_destination(dst, options.overwrite));

  // Which (param, source) feeds each HF tensor.
  struct Feed {
    const MegatronParam* param = nullptr;
    int source = 0;
  };
  std::vector<Feed> feeds(m.hf_tensors.size());
  for (const MegatronParam& p : m.params) {
    for (std::size_t s = 0; s < p.hf_names.size(); ++s) {
      feeds[static_cast<std::size_t>(m.find_hf(p.hf_names[s]))] = Feed{&p, static_cast<int>(s)};
    }
  }
  // Shard views, per rank, by param.
  std::vector<std::map<const MegatronParam*, TensorView>> shard_views(ms->ranks.size());
  for (std::size_t r = 0; r < ms->ranks.size(); ++r) {
    for (const MegatronParam& p : m.params) {
      auto v = ms->ranks[r].view(p.name);
      if (!v.ok()) return v.status();
      shard_views[r][&p] = *v;
    }
  }

  // HF shards close past max_shard_bytes, as save_pretrained does.
  std::vector<std::vector<std::size_t>> shards(1);
  std::uint64_t in_shard = 0, total = 0;
  for (std::size_t i = 0; i < m.hf_tensors.size(); ++i) {
    const std::uint64_t bytes = m.hf_tensors[i].bytes();
    if (in_shard > 0 && in_shard + bytes > options.max_shard_bytes) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back(i);
    in_shard += bytes;
    total += bytes;
  }

  ConvertSummary summary;
  summary.tensors_in = m.params.size() * ms->ranks.size();
  std::vector<ModelTensor> index;
  std::uint64_t done = 0;
  std::vector<Block> blocks;
  for (std::size_t s = 0; s < shards.size(); ++s) {
    const std::string file =
        shards.size() == 1 ? "model.safetensors" : hf_shard_name(s, shards.size());
    std::vector<TensorSpec> specs;
    for (std::size_t i : shards[s]) specs.push_back(m.hf_tensors[i]);
    auto writer = SafetensorsWriter::create(dst + "/" + file, specs, {{"format", "pt"}});
    if (!writer.ok()) return writer.status();
    StagedWriter out(&*writer);
    for (std::size_t i : shards[s]) {
      const TensorSpec& spec = m.hf_tensors[i];
      const Feed& feed = feeds[i];
      // Replicated tensors are read from rank 0; every other split has one owner per byte.
      const int ranks = feed.param->split == SplitKind::kReplicated ? 1 : m.layout.tp;
      blocks.clear();
      for (int r = 0; r < ranks; ++r) {
        for (const Run& run : shard_runs(m, *feed.param, r)) {
          if (run.source != feed.source) continue;
          for (std::uint64_t b = 0; b < run.count; ++b) {
            blocks.push_back(Block{run.hf_offset + b * run.hf_stride,
                                   run.shard_offset + b * run.block_bytes, run.block_bytes, r});
          }
        }
      }
      std::sort(blocks.begin(), blocks.end(),
                [](const Block& a, const Block& b) { return a.hf_offset < b.hf_offset; });
      std::uint64_t at = 0;
      for (const Block& b : blocks) {
        if (b.hf_offset != at) {
          return internal_error("mapping of " + spec.name + " leaves a gap or overlap at byte " +
                                std::to_string(at));
        }
        const TensorView& v = shard_views[static_cast<std::size_t>(b.rank)][feed.param];
        FERRY_RETURN_IF_ERROR(out.add(v.data.subspan(b.shard_offset, b.bytes)));
        at += b.bytes;
      }
      if (at != spec.bytes()) {
        return internal_error("mapping of " + spec.name + " covers " + std::to_string(at) + " of " +
                              std::to_string(spec.bytes()) + " bytes");
      }
      done += spec.bytes();
      if (options.progress) options.progress(done, total);
      index.push_back({SafetensorsEntry{spec, 0, 0}, file});
    }
    FERRY_RETURN_IF_ERROR(out.flush());
    FERRY_RETURN_IF_ERROR(writer->finish());
    summary.files.push_back(file);
  }
  if (shards.size() > 1) {
    FERRY_RETURN_IF_ERROR(write_model_index(dst, index, total));
  }
  FERRY_RETURN_IF_ERROR(copy_side_files(src, dst));
  summary.tensors_out = m.hf_tensors.size();
  summary.bytes_out = total;
  return summary;
}

}  // namespace ferry::convert
