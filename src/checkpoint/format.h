// The on-disk format in one place (docs/checkpoint-format.md explains it):
// folder and file names, markers, the manifest's JSON coding and its checks.
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/checkpoint.h"
#include "ferry/checkpoint_tools.h"
#include "ferry/status.h"
#include "rank_group/rank_group.h"

namespace ferry::checkpoint::format {

inline constexpr std::string_view kManifestFile = "manifest.json";
inline constexpr std::string_view kCommittedFile = "COMMITTED";
inline constexpr std::string_view kLatestFile = "latest";
inline constexpr std::string_view kFormatName = "ferry-checkpoint";

// "step_<N>" (N decimal, no padding) and its parse; nullopt for other names.
std::string step_folder(std::int64_t step);
std::optional<std::int64_t> parse_ferry_step_folder(std::string_view name);
// "<root>/step_<N>"
std::string step_path(const std::string& root, std::int64_t step);
// "NODE_<node>.committed"; the node's name and its parse.
std::string node_marker_file(std::string_view node);
std::optional<std::string> parse_node_marker(std::string_view name);

// A node name is one path component of [A-Za-z0-9._-], not "." or ".." (the rank
// groups check it when a rank joins).
using rank_group::validate_node_name;

// Manifest <-> JSON text. Decoding checks everything a loader relies on:
// version, shard format, dtypes, shapes, every slice inside its tensor, sizes, file names
// (validate_relative_path), ranks inside the layout. `source` names the file.
std::string encode_manifest(const Manifest& manifest);
Result<Manifest> decode_manifest(std::string_view text, std::string_view source);

// One entry of the manifest's "tensors", with its slice entries: the only coding of a slice
// entry, used by manifest.json and by save's exchange of each rank's slices.
nlohmann::ordered_json encode_tensor_entry(const SavedTensor& t);
// Decodes one entry and checks what it tells by itself: its dtype, every slice inside the
// tensor with `bytes` equal to its extent's size, file paths (validate_relative_path), xxh3s
// of 16 hex digits. Ranks and files against a layout are the caller's checks. Errors are
// corruption (invalid_argument for a bad path) prefixed with `source`.
Result<SavedTensor> decode_tensor_entry(const nlohmann::ordered_json& j, std::string_view source);

// The node marker: which node, which ranks' files it vouches for.
std::string encode_node_marker(std::int64_t step, std::string_view node,
                               const std::vector<SavedFile>& files);

// Reads <root>/latest ("step_<N>\n"); nullopt when missing or unreadable.
std::optional<std::int64_t> read_latest(const std::string& root);
// Replaces <root>/latest atomically (write a temp file, fsync, rename, fsync folder).
Status write_latest(const std::string& root, std::int64_t step);

// Steps present under a root, ascending.
std::vector<std::int64_t> list_step_folders(const std::string& root);

bool file_exists(const std::string& path);

}  // namespace ferry::checkpoint::format

namespace ferry::checkpoint {

// XXH3-64 of a slice's bytes, as the manifest's "xxh3" holds it.
std::uint64_t xxh3(std::span<const std::byte> data);
// 16 lower-case hex digits, as the manifest writes an XXH3.
std::string hex(std::uint64_t v);

}  // namespace ferry::checkpoint

namespace ferry::checkpoint::format {

// What one root holds of one step: markers, manifest, shard files, and which
// node it belongs to (its node marker, else its shard files' ranks in the
// manifest; "" when neither tells).
NodeStepState scan_step(const std::string& root, std::int64_t step);

// Reads and decodes <root>/step_<N>/manifest.json.
Result<Manifest> read_manifest(const std::string& root, std::int64_t step);

}  // namespace ferry::checkpoint::format
