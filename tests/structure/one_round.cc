// One round of a small model, nothing else, for scripts/round_units.py to watch: `shm` (a
// Sender and a Receiver on this node) or `net` (a Sender, a Relay on 127.0.0.1 and the
// relay's local Receiver). The model has a tensor split across buckets, so every part of a
// round runs (planning, several segments and buckets, assembly, release, END, ACK).
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "ferry/sync.h"
#include "ferry/token.h"

namespace {

using namespace ferry;
using namespace ferry::sync;

int fail(const char* what, const Status& s) {
  std::fprintf(stderr, "one_round: %s: %s\n", what, s.to_string().c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  const bool net = argc > 1 && std::strcmp(argv[1], "net") == 0;
  if (argc != 2 || (!net && std::strcmp(argv[1], "shm") != 0)) {
    std::fprintf(stderr, "usage: one_round shm|net\n");
    return 2;
  }
  auto token = token::new_text();
  if (!token.ok()) return fail("token", token.status());
  ::setenv("FERRY_TOKEN", token->c_str(), 1);
  SyncOptions o;
  o.bucket_bytes = 64 << 10;
  o.slots = 2;
  o.timeout = std::chrono::milliseconds(60'000);  // valgrind is slow
  const std::string local = "@ferry-one-round-" + std::to_string(::getpid());
  auto sender = Sender::create(net ? "127.0.0.1:0" : local, o);
  if (!sender.ok()) return fail("sender", sender.status());

  std::vector<TensorSpec> specs = {*TensorSpec::make("embed", DType::kBF16, {200, 512}),
                                   *TensorSpec::make("norm", DType::kF32, {37}),
                                   *TensorSpec::make("lm_head", DType::kF32, {100, 129})};
  std::vector<std::vector<std::byte>> data;
  std::vector<TensorView> views;
  for (const TensorSpec& s : specs) data.emplace_back(s.bytes(), std::byte{0x3c});
  for (std::size_t i = 0; i < specs.size(); ++i) views.push_back({specs[i], data[i]});

  Status relayed, received;
  std::thread relay_thread;
  if (net) {
    relay_thread = std::thread([&] {
      auto relay = Relay::connect((*sender)->address(), 0, local, o);
      if (!relay.ok()) return void(relayed = relay.status());
      relayed = (*relay)->accept(1);
      if (relayed.ok()) relayed = (*relay)->relay_round().status();
    });
  }
  std::thread receiver_thread([&] {
    auto r = Receiver::connect(local, 0, o);
    if (!r.ok()) return void(received = r.status());
    received = (*r)->receive_round([](const TensorView&) { return ok_status(); }).status();
  });
  if (Status s = (*sender)->accept(1); !s.ok()) return fail("accept", s);
  auto sent = (*sender)->send_round(views);
  receiver_thread.join();
  if (relay_thread.joinable()) relay_thread.join();
  if (!sent.ok()) return fail("send_round", sent.status());
  if (!relayed.ok()) return fail("relay", relayed);
  if (!received.ok()) return fail("receive_round", received);
  std::printf("one_round %s: %llu bytes\n", argv[1], static_cast<unsigned long long>(sent->bytes));
  return 0;
}
