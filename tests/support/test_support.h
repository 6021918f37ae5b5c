// Helpers shared by ferry's tests: temporary folders, running the CLI, hashing.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace ferry::testing {

// A fresh folder under $TMPDIR, removed (with its contents) on destruction.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

struct CommandResult {
  int exit_code = -1;
  std::string out;  // stdout
  std::string err;  // stderr
};

// Runs the built `ferry` binary with `args` (no shell), capturing its output.
CommandResult run_ferry(const std::vector<std::string>& args);
// The same with exactly `env` ("NAME=value" entries) as the environment, nothing inherited.
CommandResult run_ferry(const std::vector<std::string>& args, const std::vector<std::string>& env);

// Writes bytes to a file (for hand-made malformed inputs).
void write_bytes(const std::string& path, const std::string& bytes);

// XXH3-64 of bytes, for bit-exactness checks.
std::uint64_t hash_bytes(std::span<const std::byte> data);

}  // namespace ferry::testing
