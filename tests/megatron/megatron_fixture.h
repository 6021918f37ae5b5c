// Fake verl / Megatron checkpoint folders in the layout they really write (docs/checkpoint.md
// cites the sources), one folder per node, with small files shaped like the real ones:
//
//   <node>/latest_checkpointed_iteration.txt      "N" (verl writes str(step), no newline)
//   <node>/global_step_N/<role>/dist_ckpt/
//       common.pt                                   rank 0: a torch.save zip ("PK\3\4" ...)
//       .metadata                                   rank 0 (DCP coordinator): a pickle
//       metadata.json                               rank 0, last: Megatron's CheckpointingConfig
//       __<rank>_0.distcp                           each rank, on its own node
//   <node0>/global_step_N/<role>/huggingface/config.json, transformer_config.json (rank 0)
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "base/file_util.h"
#include "support/test_support.h"

namespace ferry::checkpoint::test {

namespace fs = std::filesystem;

inline constexpr char kMegatronConfigJson[] =
    R"({"sharded_backend": "torch_dist", "sharded_backend_version": 1, )"
    R"("common_backend": "torch", "common_backend_version": 1})";

// Deterministic bytes after a fixed prefix (a file type's magic).
inline std::string fake_bytes(const std::string& prefix, std::size_t n, std::uint64_t seed) {
  std::string s = prefix;
  std::mt19937_64 rng(seed);
  while (s.size() < n) s.push_back(static_cast<char>(rng()));
  s.resize(n);
  return s;
}

struct VerlSave {
  std::int64_t step = 1;
  std::vector<std::string> roles = {"actor"};
  // Where a role's torch_dist folder lies inside global_step_N/<role>: "dist_ckpt" (verl up
  // to its layout v2) or e.g. "model/dist_ckpt" and "optimizer/dist_ckpt" (v2).
  std::vector<std::string> dist_subfolders = {"dist_ckpt"};
  int ranks_per_node = 2;
  std::size_t common_bytes = 2000;
  std::size_t dcp_metadata_bytes = 5000;
  // false: the save is still running on rank 0 (no metadata.json yet, tracker not moved).
  bool finished = true;
};

inline std::string dist_path(std::int64_t step, const std::string& role = "actor",
                             const std::string& sub = "dist_ckpt") {
  return "global_step_" + std::to_string(step) + "/" + role + "/" + sub;
}

inline void put(const std::string& path, const std::string& bytes) {
  fs::create_directories(fs::path(path).parent_path());
  testing::write_bytes(path, bytes);
}

// What verl's Megatron save writes on each node: node 0 holds rank 0 and the metadata.
inline void write_verl_save(const std::vector<std::string>& nodes, const VerlSave& s) {
  for (std::size_t n = 0; n < nodes.size(); ++n) {
    for (const std::string& role : s.roles) {
      for (const std::string& sub : s.dist_subfolders) {
        const std::string d = nodes[n] + "/" + dist_path(s.step, role, sub);
        fs::create_directories(d);
        for (int r = 0; r < s.ranks_per_node; ++r) {
          const int rank = static_cast<int>(n) * s.ranks_per_node + r;
          put(d + "/__" + std::to_string(rank) + "_0.distcp",
              fake_bytes("", 4096, static_cast<std::uint64_t>(s.step * 1000 + rank)));
        }
        if (n != 0) continue;
        const std::uint64_t seed =
            static_cast<std::uint64_t>(s.step) * 7919 + role.size() + sub.size();
        put(d + "/common.pt", fake_bytes("PK\x03\x04", s.common_bytes, seed));
        put(d + "/.metadata", fake_bytes("\x80\x04\x95", s.dcp_metadata_bytes, seed + 1));
        if (s.finished) put(d + "/metadata.json", kMegatronConfigJson);
      }
      if (n == 0) {
        const std::string step_dir =
            nodes[0] + "/global_step_" + std::to_string(s.step) + "/" + role;
        put(step_dir + "/huggingface/config.json", R"({"model_type": "qwen2"})");
        put(step_dir + "/transformer_config.json", R"({"num_layers": 2})");
      }
    }
  }
  if (s.finished)
    testing::write_bytes(nodes[0] + "/latest_checkpointed_iteration.txt", std::to_string(s.step));
}

inline std::string slurp(const std::string& path) {
  auto s = read_file(path);
  return s.ok() ? *s : std::string("<missing>");
}

// Every regular file under `root`, relative, sorted: to show nothing else was written.
inline std::vector<std::string> tree(const std::string& root) {
  std::vector<std::string> out;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(root, ec);
       it != fs::recursive_directory_iterator(); it.increment(ec)) {
    if (it->is_regular_file(ec)) out.push_back(fs::relative(it->path(), root).string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

// A token file as Token::from_file accepts it (mode 0600).
inline std::string write_token(const testing::TempDir& dir, const std::string& name,
                               const std::string& secret) {
  const std::string path = dir.file(name);
  testing::write_bytes(path, secret + "\n");
  ::chmod(path.c_str(), 0600);
  return path;
}

// Spawned and self_binary(): tests/support/test_support.h.
using ferry::testing::self_binary;
using ferry::testing::Spawned;

}  // namespace ferry::checkpoint::test
