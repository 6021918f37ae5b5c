// The on-disk format in one place (docs/checkpoint-format.md explains it):
// folder and file names, markers, the manifest's JSON coding and its checks.
#pragma once

#include <cstdint>
#include <optional>
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
// "rank_<r 5 digits>.safetensors"
std::string shard_file(int rank);
// "NODE_<node>.committed"; the node's name and its parse.
std::string node_marker_file(std::string_view node);
std::optional<std::string> parse_node_marker(std::string_view name);

// A node name is one path component of [A-Za-z0-9._-], not "." or ".." (the rank
// groups check it when a rank joins).
using rank_group::validate_node_name;

// Manifest <-> JSON text. Decoding checks everything a loader relies on:
// version, dtypes, shapes, every slice inside its tensor, sizes, file names
// (validate_relative_path), ranks inside the layout. `source` names the file.
std::string encode_manifest(const Manifest& manifest);
Result<Manifest> decode_manifest(std::string_view text, std::string_view source);

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

namespace ferry::checkpoint::format {

// What one root holds of one step: markers, manifest, shard files, and which
// node it belongs to (its node marker, else its shard files' ranks in the
// manifest; "" when neither tells).
NodeStepState scan_step(const std::string& root, std::int64_t step);

// Reads and decodes <root>/step_<N>/manifest.json.
Result<Manifest> read_manifest(const std::string& root, std::int64_t step);

}  // namespace ferry::checkpoint::format
