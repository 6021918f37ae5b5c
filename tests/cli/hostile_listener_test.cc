// Issue 14's "done when", through the built binary: `ferry sync serve --listen` and
// `ferry ckpt replicate --serve` meet hostile clients first (one that connects and vanishes,
// 64 bytes of 0xff, 20 silent connections from three other addresses, a peer with the wrong
// token), then serve a legitimate peer and exit 0.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "megatron/megatron_fixture.h"
#include "support/test_support.h"

namespace ferry {
namespace {

using std::chrono::milliseconds;
using testing::run_ferry;
using testing::Spawned;

constexpr const char* kGoodSecret = ::ferry::testing::kTestToken;
constexpr const char* kWrongSecret = ::ferry::testing::kOtherTestToken;

// A TCP connection to 127.0.0.1:port from loopback address `from`; -1 if refused.
int tcp_connect(int port, const char* from = "127.0.0.1") {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in source{};
  source.sin_family = AF_INET;
  ::inet_pton(AF_INET, from, &source.sin_addr);
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(static_cast<std::uint16_t>(port));
  ::inet_pton(AF_INET, "127.0.0.1", &to.sin_addr);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&source), sizeof source) != 0 ||
      ::connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof to) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// The hostile clients, in order; returns the silent connections, still open.
std::vector<int> attack(int port) {
  int fd = -1;
  for (int i = 0; i < 500 && fd < 0; ++i) {  // the server may still be starting
    fd = tcp_connect(port);
    if (fd < 0) std::this_thread::sleep_for(milliseconds(20));
  }
  EXPECT_GE(fd, 0) << "nothing listens on port " << port;
  ::close(fd);  // connects and vanishes
  fd = tcp_connect(port);
  EXPECT_GE(fd, 0);
  const std::vector<unsigned char> garbage(64, 0xff);
  EXPECT_EQ(::write(fd, garbage.data(), garbage.size()), 64);
  std::this_thread::sleep_for(milliseconds(50));
  ::close(fd);
  std::vector<int> silent;
  for (const char* from : {"127.0.0.2", "127.0.0.3", "127.0.0.4"}) {
    for (int i = 0; i < 7; ++i) {
      fd = tcp_connect(port, from);
      if (fd >= 0) silent.push_back(fd);
    }
  }
  EXPECT_EQ(silent.size(), 21u);
  return silent;
}

struct Tokens {
  testing::TempDir dir;
  std::string good = checkpoint::test::write_token(dir, "good", kGoodSecret);
  std::string wrong = checkpoint::test::write_token(dir, "wrong", kWrongSecret);
};

TEST(HostileClients, SyncServeSurvivesThemAndServesALegitimateReceiver) {
  Tokens t;
  const std::string address = testing::unused_loopback_address();
  const int port = std::stoi(address.substr(address.rfind(':') + 1));
  Spawned server(FERRY_BINARY,
                 {"sync", "serve", "--listen", address, "--receivers", "1", "--layers", "1",
                  "--bucket-mb", "16", "--timeout", "60", "--json", "--token-file", t.good},
                 {});
  std::vector<int> silent = attack(port);
  auto wrong =
      run_ferry({"sync", "recv", "--connect", address, "--timeout", "10", "--token-file", t.wrong});
  EXPECT_EQ(wrong.exit_code, 1) << wrong.out << wrong.err;
  EXPECT_NE(wrong.err.find("refused our token"), std::string::npos) << wrong.err;

  auto good = run_ferry(
      {"sync", "recv", "--connect", address, "--timeout", "30", "--json", "--token-file", t.good});
  EXPECT_EQ(good.exit_code, 0) << good.out << good.err;
  const auto round = nlohmann::json::parse(good.out, nullptr, false);
  ASSERT_FALSE(round.is_discarded()) << good.out;
  const auto served = nlohmann::json::parse(server.read_line(), nullptr, false);
  ASSERT_FALSE(served.is_discarded());
  EXPECT_EQ(round["checksum"], served["checksum"]) << good.out;
  EXPECT_EQ(server.wait(milliseconds(10000)), 0);
  for (int fd : silent) ::close(fd);
}

TEST(HostileClients, ReplicateServeSurvivesThemAndServesALegitimatePuller) {
  Tokens t;
  const std::string n0 = t.dir.file("ckpt/node0"), n1 = t.dir.file("ckpt/node1");
  checkpoint::test::write_verl_save({n0, n1}, {.step = 3});
  Spawned server(FERRY_BINARY,
                 {"ckpt", "replicate", n0, "--serve", "127.0.0.1:0", "--clients", "1", "--json",
                  "--token-file", t.good},
                 {});
  const auto listening = nlohmann::json::parse(server.read_line(), nullptr, false);
  ASSERT_FALSE(listening.is_discarded());
  const std::string address = listening["address"];
  const int port = std::stoi(address.substr(address.rfind(':') + 1));
  std::vector<int> silent = attack(port);
  auto wrong = run_ferry({"ckpt", "replicate", n1, "--from", address, "--token-file", t.wrong});
  EXPECT_EQ(wrong.exit_code, 1) << wrong.out << wrong.err;

  auto good =
      run_ferry({"ckpt", "replicate", n1, "--from", address, "--json", "--token-file", t.good});
  ASSERT_EQ(good.exit_code, 0) << good.out << good.err;
  EXPECT_EQ(nlohmann::json::parse(good.out)["files_copied"], 4);
  EXPECT_EQ(server.wait(milliseconds(10000)), 0);  // --clients 1: done after the one pull
  EXPECT_EQ(run_ferry({"ckpt", "verify", t.dir.file("ckpt")}).exit_code, 0);
  for (int fd : silent) ::close(fd);
}

}  // namespace
}  // namespace ferry
