#include "support/test_support.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>
#include <xxhash.h>

#include <chrono>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <stdexcept>
#include <thread>

extern char** environ;

namespace ferry::testing {

TempDir::TempDir() {
  const char* base = std::getenv("TMPDIR");
  std::string tmpl = std::string(base && *base ? base : "/tmp") + "/ferry-test-XXXXXX";
  if (::mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
  path_ = tmpl;
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

namespace {

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

CommandResult run_ferry_in(const std::vector<std::string>& args, char** envp);

}  // namespace

CommandResult run_ferry(const std::vector<std::string>& args) {
  return run_ferry_in(args, environ);
}

CommandResult run_ferry(const std::vector<std::string>& args, const std::vector<std::string>& env) {
  std::vector<std::string> copy = env;
  std::vector<char*> envp;
  for (std::string& e : copy) envp.push_back(e.data());
  envp.push_back(nullptr);
  return run_ferry_in(args, envp.data());
}

namespace {

CommandResult run_ferry_in(const std::vector<std::string>& args, char** envp) {
  TempDir dir;
  const std::string out_path = dir.file("stdout");
  const std::string err_path = dir.file("stderr");
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&actions, 1, out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC,
                                   0600);
  posix_spawn_file_actions_addopen(&actions, 2, err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC,
                                   0600);
  std::vector<std::string> argv_s = {FERRY_BINARY};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  CommandResult r;
  if (posix_spawn(&pid, FERRY_BINARY, &actions, nullptr, argv.data(), envp) != 0) {
    posix_spawn_file_actions_destroy(&actions);
    r.err = "posix_spawn failed";
    return r;
  }
  posix_spawn_file_actions_destroy(&actions);
  int status = 0;
  ::waitpid(pid, &status, 0);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.out = slurp(out_path);
  r.err = slurp(err_path);
  return r;
}

}  // namespace

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::uint64_t hash_bytes(std::span<const std::byte> data) {
  return XXH3_64bits(data.data(), data.size());
}

Spawned::Spawned(const std::string& binary, const std::vector<std::string>& args,
                 const std::vector<std::string>& env) {
  int out[2];
  if (::pipe2(out, O_CLOEXEC) != 0) throw std::runtime_error("pipe2 failed");
  std::vector<std::string> env_text = env;
  for (char** e = environ; *e != nullptr; ++e) {
    // The test's own FERRY_ settings stay here, but for the net path a run is made for: the
    // child must speak to this process on it.
    if (std::strncmp(*e, "FERRY_", 6) != 0 || std::strncmp(*e, "FERRY_NET_PATH=", 15) == 0) {
      env_text.emplace_back(*e);
    }
  }
  std::vector<char*> envp;
  for (auto& e : env_text) envp.push_back(e.data());
  envp.push_back(nullptr);
  std::vector<std::string> argv_text = {binary};
  argv_text.insert(argv_text.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : argv_text) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, out[1], 1);
  pid_t pid = -1;
  const int rc = ::posix_spawn(&pid, binary.c_str(), &fa, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&fa);
  ::close(out[1]);
  out_ = out[0];
  if (rc != 0) throw std::runtime_error("posix_spawn " + binary + " failed");
  pid_ = pid;
}

std::vector<std::unique_ptr<Spawned>> spawn_part_servers(const std::string& ferry_binary,
                                                         const std::vector<std::string>& addresses,
                                                         const std::vector<std::string>& parts,
                                                         const std::vector<std::string>& extra) {
  std::vector<std::unique_ptr<Spawned>> servers;
  for (std::size_t k = 0; k < addresses.size(); ++k) {
    std::vector<std::string> args = {"sync",       "serve",  "--address",
                                     addresses[k], "--part", parts.at(k)};
    args.insert(args.end(), extra.begin(), extra.end());
    servers.push_back(std::make_unique<Spawned>(ferry_binary, args, std::vector<std::string>{}));
  }
  return servers;
}

Spawned::~Spawned() {
  kill();
  ::close(out_);
}

std::string Spawned::read_line() {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  std::size_t eol;
  while ((eol = pending_.find('\n')) == std::string::npos &&
         std::chrono::steady_clock::now() < deadline) {
    pollfd p{out_, POLLIN, 0};
    if (::poll(&p, 1, 100) <= 0) continue;
    char buf[512];
    const ssize_t n = ::read(out_, buf, sizeof buf);
    if (n <= 0) break;
    pending_.append(buf, static_cast<std::size_t>(n));
  }
  std::string line = pending_.substr(0, eol);
  pending_.erase(0, eol == std::string::npos ? eol : eol + 1);
  return line;
}

void Spawned::signal(int sig) {
  if (pid_ > 0) ::kill(pid_, sig);
}

int Spawned::wait(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (pid_ > 0) {
    int status = 0;
    if (::waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    }
    if (std::chrono::steady_clock::now() >= deadline) return -1;
    ::usleep(10'000);
  }
  return -1;
}

void Spawned::kill() {
  if (pid_ <= 0) return;
  ::kill(pid_, SIGKILL);
  ::waitpid(pid_, nullptr, 0);
  pid_ = -1;
}

std::string self_binary() {
  char self[4096] = {};
  if (::readlink("/proc/self/exe", self, sizeof self - 1) <= 0) {
    throw std::runtime_error("readlink /proc/self/exe failed");
  }
  return self;
}

int connect_abstract(const std::string& address, int type) {
  sockaddr_un a{};
  if (address.empty() || address.size() > sizeof(a.sun_path)) return -1;
  a.sun_family = AF_UNIX;
  std::memcpy(a.sun_path, address.data(), address.size());
  a.sun_path[0] = '\0';
  const auto len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + address.size());
  for (int i = 0; i < 500; ++i) {
    const int fd = ::socket(AF_UNIX, type | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    if (::connect(fd, reinterpret_cast<sockaddr*>(&a), len) == 0) return fd;
    ::close(fd);
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return -1;
}

int connect_as_another_user(const std::string& address, int type) {
  int ready[2];
  if (::pipe(ready) != 0) return -1;
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(ready[0]);
    char ok = 0;
    if (::setresgid(65534, 65534, 65534) == 0 && ::setresuid(65534, 65534, 65534) == 0) {
      ok = connect_abstract(address, type) >= 0 ? 1 : 0;
    }
    (void)!::write(ready[1], &ok, 1);
    ::sleep(20);
    ::_exit(0);
  }
  ::close(ready[1]);
  char ok = 0;
  const bool read_ok = ::read(ready[0], &ok, 1) == 1;
  ::close(ready[0]);
  if (!read_ok || ok != 1) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
    return -1;
  }
  return pid;
}

std::string unused_loopback_address() {
  std::random_device seed;
  std::mt19937 rng(seed());
  std::uniform_int_distribution<int> pick(20000, 32000);  // ephemeral ports start at 32768
  for (int attempt = 0; attempt < 100; ++attempt) {
    const int port = pick(rng);
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<std::uint16_t>(port));
    const bool free = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
    ::close(fd);
    if (free) return "127.0.0.1:" + std::to_string(port);
  }
  throw std::runtime_error("no free loopback port in 20000-32000 after 100 tries");
}

}  // namespace ferry::testing
