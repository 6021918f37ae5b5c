#include "checkpoint/format.h"

#include <dirent.h>
#include <sys/stat.h>
#include <xxhash.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "base/atomic_file.h"
#include "base/file_util.h"
#include "base/parse_number.h"
#include "base/status_macros.h"
#include "checkpoint/shard_format.h"
#include "checkpoint/slice.h"

namespace ferry::checkpoint {

std::uint64_t xxh3(std::span<const std::byte> data) {
  return XXH3_64bits(data.data(), data.size());
}

std::string hex(std::uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016" PRIx64, v);
  return buf;
}

Status validate_relative_path(std::string_view path, std::string_view what) {
  auto bad = [&](std::string_view why) {
    return invalid_argument(std::string(what) + " '" + std::string(path) + "' " + std::string(why) +
                            " (it must stay inside the checkpoint folder)");
  };
  if (path.empty()) return bad("is empty");
  if (path.front() == '/') return bad("is an absolute path");
  if (path.find('\0') != std::string_view::npos) return bad("contains a NUL byte");
  if (path.find('\\') != std::string_view::npos) return bad("contains a backslash");
  std::size_t start = 0;
  while (start <= path.size()) {
    std::size_t end = path.find('/', start);
    if (end == std::string_view::npos) end = path.size();
    std::string_view part = path.substr(start, end - start);
    if (part.empty()) return bad("has an empty component");
    if (part == "..") return bad("has a '..' component");
    if (part == ".") return bad("has a '.' component");
    start = end + 1;
  }
  return ok_status();
}

namespace format {

using json = nlohmann::ordered_json;

std::string step_folder(std::int64_t step) { return "step_" + std::to_string(step); }

std::optional<std::int64_t> parse_ferry_step_folder(std::string_view name) {
  if (name.substr(0, 5) != "step_") return std::nullopt;
  const auto v = parse_uint(name.substr(5));
  if (!v || step_folder(*v) != name) return std::nullopt;  // no leading zeros: one name per step
  return v;
}

std::string step_path(const std::string& root, std::int64_t step) {
  return root + "/" + step_folder(step);
}

std::string node_marker_file(std::string_view node) {
  return "NODE_" + std::string(node) + ".committed";
}

std::optional<std::string> parse_node_marker(std::string_view name) {
  constexpr std::string_view kPrefix = "NODE_", kSuffix = ".committed";
  if (name.size() <= kPrefix.size() + kSuffix.size()) return std::nullopt;
  if (name.substr(0, kPrefix.size()) != kPrefix) return std::nullopt;
  if (name.substr(name.size() - kSuffix.size()) != kSuffix) return std::nullopt;
  std::string node(name.substr(kPrefix.size(), name.size() - kPrefix.size() - kSuffix.size()));
  if (!validate_node_name(node).ok()) return std::nullopt;
  return node;
}

namespace {

Result<std::uint64_t> parse_hex64(const std::string& s, std::string_view what) {
  auto bad = [&] {
    return corruption(std::string(what) + ": xxh3 '" + s.substr(0, 40) + "' must be 16 hex digits");
  };
  if (s.size() != 16) return bad();
  std::uint64_t v = 0;
  for (char c : s) {
    int d = (c >= '0' && c <= '9') ? c - '0' : (c >= 'a' && c <= 'f') ? c - 'a' + 10 : -1;
    if (d < 0) return bad();
    v = (v << 4) | static_cast<std::uint64_t>(d);
  }
  return v;
}

}  // namespace

json encode_tensor_entry(const SavedTensor& t) {
  json slices = json::array();
  for (const SavedSlice& s : t.slices) {
    slices.push_back({{"rank", s.rank},
                      {"file", s.file},
                      {"tensor", s.tensor_in_file},
                      {"offset", s.offset},
                      {"extent", s.extent},
                      {"data_offset", s.data_offset},
                      {"bytes", s.bytes},
                      {"xxh3", hex(s.xxh3)}});
  }
  return {{"name", t.name},
          {"dtype", std::string(dtype_name(t.dtype))},
          {"shape", t.shape},
          {"slices", slices}};
}

Result<SavedTensor> decode_tensor_entry(const json& t, std::string_view source) {
  const std::string src(source);
  SavedTensor st;
  try {
    st.name = t.at("name").get<std::string>();
    auto dtype = parse_dtype(t.at("dtype").get<std::string>());
    if (!dtype.ok()) return dtype.status().with_context(src + ": tensor " + st.name);
    st.dtype = *dtype;
    st.shape = t.at("shape").get<std::vector<std::int64_t>>();
    for (const json& s : t.at("slices")) {
      SavedSlice ss;
      ss.rank = s.at("rank").get<int>();
      ss.file = s.at("file").get<std::string>();
      ss.tensor_in_file = s.at("tensor").get<std::string>();
      ss.offset = s.at("offset").get<std::vector<std::int64_t>>();
      ss.extent = s.at("extent").get<std::vector<std::int64_t>>();
      ss.data_offset = s.at("data_offset").get<std::uint64_t>();
      ss.bytes = s.at("bytes").get<std::uint64_t>();
      const std::string what = src + ": tensor " + st.name + " slice in " + ss.file;
      FERRY_ASSIGN_OR_RETURN(ss.xxh3, parse_hex64(s.at("xxh3").get<std::string>(), what));
      if (Status v = validate_relative_path(ss.file, "file"); !v.ok()) return v.with_context(what);
      SliceSpec spec{st.name, st.dtype, st.shape, ss.offset, ss.extent};
      if (Status v = spec.validate(); !v.ok()) return corruption(what + ": " + v.message());
      if (spec.bytes() != ss.bytes) return corruption(what + ": bytes do not match the extent");
      st.slices.push_back(std::move(ss));
    }
  } catch (const json::exception& e) {
    return corruption(src + ": malformed tensor entry: " + e.what());
  }
  return st;
}

std::string encode_manifest(const Manifest& m) {
  json j;
  j["format"] = kFormatName;
  j["version"] = m.version;
  // Written only for a format other than safetensors, so a safetensors checkpoint's manifest
  // keeps the bytes it had before formats had names.
  if (m.shard_format != kDefaultShardFormat) j["shard_format"] = m.shard_format;
  j["step"] = m.step;
  j["layout"] = {{"world_size", m.layout.world_size},
                 {"ranks_per_node", m.layout.ranks_per_node},
                 {"nodes", m.layout.nodes},
                 {"rank_nodes", m.layout.rank_nodes}};
  json files = json::array();
  for (const SavedFile& f : m.files) {
    files.push_back({{"file", f.file}, {"rank", f.rank}, {"node", f.node}, {"bytes", f.bytes}});
  }
  j["files"] = files;
  json tensors = json::array();
  for (const SavedTensor& t : m.tensors) tensors.push_back(encode_tensor_entry(t));
  j["tensors"] = tensors;
  json common = json::parse(m.common_state, nullptr, /*allow_exceptions=*/false);
  j["common_state"] = common.is_discarded() ? json::object() : common;
  return j.dump(1) + "\n";
}

Result<Manifest> decode_manifest(std::string_view text, std::string_view source) {
  const std::string src(source);
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return corruption(src + ": not a JSON object");
  Manifest m;
  try {
    if (j.value("format", "") != kFormatName) {
      return corruption(src + ": 'format' is not \"" + std::string(kFormatName) + "\"");
    }
    m.version = j.at("version").get<int>();
    if (m.version != kFormatVersion) {
      return failed_precondition(src + ": format version " + std::to_string(m.version) +
                                 " is not supported (this ferry reads version " +
                                 std::to_string(kFormatVersion) + ")");
    }
    m.shard_format = j.value("shard_format", std::string(kDefaultShardFormat));
    if (auto f = shard_format_for(m.shard_format); !f.ok()) return f.status().with_context(src);
    m.step = j.at("step").get<std::int64_t>();
    const json& l = j.at("layout");
    m.layout.world_size = l.at("world_size").get<int>();
    m.layout.ranks_per_node = l.at("ranks_per_node").get<int>();
    m.layout.nodes = l.at("nodes").get<std::vector<std::string>>();
    m.layout.rank_nodes = l.at("rank_nodes").get<std::vector<std::string>>();
    if (m.layout.world_size <= 0 ||
        m.layout.rank_nodes.size() != static_cast<std::size_t>(m.layout.world_size)) {
      return corruption(src + ": layout.rank_nodes must name a node for each of world_size ranks");
    }
    std::set<std::string> nodes(m.layout.nodes.begin(), m.layout.nodes.end());
    for (const std::string& n : m.layout.nodes) {
      if (Status s = validate_node_name(n); !s.ok()) return s.with_context(src);
    }
    for (const std::string& n : m.layout.rank_nodes) {
      if (!nodes.count(n))
        return corruption(src + ": rank node '" + n + "' is not in layout.nodes");
    }
    auto check_rank = [&](int r) -> Status {
      if (r < 0 || r >= m.layout.world_size) {
        return corruption(src + ": rank " + std::to_string(r) + " is outside the layout");
      }
      return ok_status();
    };
    std::map<std::string, std::uint64_t> file_bytes;
    for (const json& f : j.at("files")) {
      SavedFile sf;
      sf.file = f.at("file").get<std::string>();
      sf.rank = f.at("rank").get<int>();
      sf.node = f.at("node").get<std::string>();
      sf.bytes = f.at("bytes").get<std::uint64_t>();
      if (Status s = validate_relative_path(sf.file, "file"); !s.ok()) return s.with_context(src);
      FERRY_RETURN_IF_ERROR(check_rank(sf.rank));
      if (sf.node != m.layout.rank_nodes[sf.rank]) {
        return corruption(src + ": file " + sf.file + " is on node '" + sf.node + "' but rank " +
                          std::to_string(sf.rank) + " is on '" + m.layout.rank_nodes[sf.rank] +
                          "'");
      }
      if (!file_bytes.emplace(sf.file, sf.bytes).second) {
        return corruption(src + ": file " + sf.file + " is listed twice");
      }
      m.files.push_back(std::move(sf));
    }
    for (const json& t : j.at("tensors")) {
      FERRY_ASSIGN_OR_RETURN(SavedTensor st, decode_tensor_entry(t, src));
      for (const SavedSlice& ss : st.slices) {
        const std::string what = src + ": tensor " + st.name + " slice in " + ss.file;
        FERRY_RETURN_IF_ERROR(check_rank(ss.rank));
        auto fb = file_bytes.find(ss.file);
        if (fb == file_bytes.end()) return corruption(what + ": file is not in 'files'");
        if (ss.data_offset > fb->second || ss.bytes > fb->second - ss.data_offset) {
          return corruption(what + ": data_offset + bytes is past the file's size");
        }
      }
      m.tensors.push_back(std::move(st));
    }
    std::sort(m.tensors.begin(), m.tensors.end(),
              [](const SavedTensor& a, const SavedTensor& b) { return a.name < b.name; });
    for (std::size_t i = 1; i < m.tensors.size(); ++i) {
      if (m.tensors[i].name == m.tensors[i - 1].name) {
        return corruption(src + ": tensor " + m.tensors[i].name + " is listed twice");
      }
    }
    if (j.contains("common_state")) m.common_state = j["common_state"].dump();
  } catch (const json::exception& e) {
    return corruption(src + ": malformed manifest: " + e.what());
  }
  return m;
}

std::string encode_node_marker(std::int64_t step, std::string_view node,
                               const std::vector<SavedFile>& files) {
  json j;
  j["format"] = kFormatName;
  j["step"] = step;
  j["node"] = node;
  json fs = json::array();
  for (const SavedFile& f : files) {
    if (f.node == node) fs.push_back({{"file", f.file}, {"rank", f.rank}, {"bytes", f.bytes}});
  }
  j["files"] = fs;
  return j.dump(1) + "\n";
}

std::optional<std::int64_t> read_latest(const std::string& root) {
  auto text = read_file(root + "/" + std::string(kLatestFile));
  if (!text.ok()) return std::nullopt;
  std::string s = *text;
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return parse_ferry_step_folder(s);
}

Status write_latest(const std::string& root, std::int64_t step) {
  return write_file_atomic(root + "/" + std::string(kLatestFile), step_folder(step) + "\n");
}

std::vector<std::int64_t> list_step_folders(const std::string& root) {
  std::vector<std::int64_t> out;
  DIR* d = ::opendir(root.c_str());
  if (d == nullptr) return out;
  while (dirent* e = ::readdir(d)) {
    auto step = parse_ferry_step_folder(e->d_name);
    if (step && !format::file_exists(root + "/" + e->d_name + "/.")) continue;
    if (step) out.push_back(*step);
  }
  ::closedir(d);
  std::sort(out.begin(), out.end());
  return out;
}

bool file_exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

}  // namespace format
}  // namespace ferry::checkpoint

namespace ferry::checkpoint::format {

Result<Manifest> read_manifest(const std::string& root, std::int64_t step) {
  const std::string path = step_path(root, step) + "/" + std::string(kManifestFile);
  auto text = read_file(path);
  if (!text.ok()) return text.status();
  auto m = decode_manifest(*text, path);
  if (m.ok() && m->step != step) {
    return corruption(path + ": manifest is of step " + std::to_string(m->step));
  }
  return m;
}

NodeStepState scan_step(const std::string& root, std::int64_t step) {
  NodeStepState st;
  st.root = root;
  const std::string dir = step_path(root, step);
  std::vector<std::string> markers;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (dirent* e = ::readdir(d)) {
      std::string name = e->d_name;
      if (name == kManifestFile)
        st.manifest = true;
      else if (name == kCommittedFile)
        st.committed = true;
      else if (auto node = parse_node_marker(name))
        markers.push_back(*node);
      else if (name.size() > 12 && name.substr(0, 5) == "rank_" &&
               name.substr(name.size() - 12) == ".safetensors")
        st.files.push_back(name);
    }
    ::closedir(d);
  }
  std::sort(st.files.begin(), st.files.end());
  if (!markers.empty()) {
    st.node_marker = true;
    st.node = markers.front();
  } else if (st.manifest && !st.files.empty()) {
    if (auto m = read_manifest(root, step); m.ok()) {
      for (const SavedFile& f : m->files) {
        if (f.file == st.files.front()) st.node = f.node;
      }
    }
  }
  return st;
}

}  // namespace ferry::checkpoint::format
