// Helpers shared by ferry's tests: temporary folders, running the CLI, hashing.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace ferry::testing {

// Session tokens of the kind `ferry token new` makes (64 hex digits, 256 random bits), fixed
// so that runs repeat. Net sessions refuse anything weaker than 128 bits by ferry's estimate,
// and "test-token-" with a short hex suffix is (issue 31). kOtherTestToken: a wrong one.
inline constexpr const char* kTestToken =
    "900853a5573a5c8147ca21597103b52bf8163ad0d64d02bf872a57e1adc882f4";
inline constexpr const char* kOtherTestToken =
    "df3e0acb0238bed6d348b4cef2d91c70b58be035bc325bf4f0523b3e21428244";

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

// A child process whose stdout is a pipe the test reads lines from: a `ferry` command, or
// this test binary re-executed as a peer (self_binary()). Its environment is the test's
// without FERRY_* variables, plus `env` ("NAME=value"). SIGKILLed on destruction if running.
class Spawned {
 public:
  Spawned(const std::string& binary, const std::vector<std::string>& args,
          const std::vector<std::string>& env);
  ~Spawned();
  Spawned(const Spawned&) = delete;
  Spawned& operator=(const Spawned&) = delete;

  // One line it printed (without the newline), or what it had at EOF / after 10 s.
  std::string read_line();
  void signal(int sig);
  // Its exit code (128 + signal when killed by one), or -1 if it runs on after `timeout`.
  int wait(std::chrono::milliseconds timeout);
  void kill();

 private:
  int pid_ = -1;
  int out_ = -1;
  std::string pending_;  // read but not yet returned
};

// Several senders of one model: `ferry_binary sync serve --address addresses[k] --part
// parts[k] <extra...>` for each k, each its own child.
std::vector<std::unique_ptr<Spawned>> spawn_part_servers(const std::string& ferry_binary,
                                                         const std::vector<std::string>& addresses,
                                                         const std::vector<std::string>& parts,
                                                         const std::vector<std::string>& extra);

// "127.0.0.1:PORT" where nothing listens now, for a server that must be told its port in
// advance (a checkpoint group's rank 0). PORT is random below the kernel's ephemeral range:
// a port bind(0) hands out can be taken again by any connect() of a test running beside.
std::string unused_loopback_address();

// A connection of `type` (SOCK_STREAM, SOCK_SEQPACKET) to the abstract UNIX `address`
// ("@name"), retried for up to 5 s while nobody listens yet; -1 if it never connects.
int connect_abstract(const std::string& address, int type);
// A child that connects to the abstract `address` as uid/gid 65534 and stays silent until
// killed (or 20 s): a peer of another user. Its pid once connected, -1 if it could not.
int connect_as_another_user(const std::string& address, int type);

// This test binary's path, for re-executing it as a child.
std::string self_binary();

}  // namespace ferry::testing
