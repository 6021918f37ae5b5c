// Feeds a token holder's byte stream to a channel on ferry's TCP path (tcp_stream.cc): frames
// sealed with the session's key, of any kind and payload (messages, FIN, ANNOUNCE, READY, DATA),
// raw bytes between them, while the channel's side posts receives of any key and size. Nothing
// may crash or write outside a posted buffer (each is a heap block of its own size, for ASan),
// and nothing may hang: once the stream ends every receive finishes. The input is records,
// each led by a byte whose value mod 4 says what follows:
//   0: a sealed frame: its kind (1 byte), payload length (1 byte), payload
//   1: raw bytes: length (1 byte), bytes
//   2: a receive on the channel's side: key (1 byte, mod 4), capacity (1 byte, x 16 bytes)
//   3: a turn of the channel's side: try_receive(), then done() on every receive
// Seeds: fuzz/corpus/transport_tcp_stream_fuzz/ (fuzz/seeds/tcp_stream_seeds.py).
#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <span>
#include <vector>

#include "transport/net/auth.h"
#include "transport/net/channel.h"
#include "transport/net/context.h"
#include "transport/net/seal.h"

namespace net = ferry::net;

namespace {

// The session's keys: the fuzzer is the connector, the channel the listener (as in
// transport_address_frame_fuzz).
constexpr const char* kToken = "595e0ea72283ceaab9fff7db4dce494ff27fb0f69d2243874ffce94b5e27303f";
struct Session {
  net::SessionKeys connector;
  net::SessionKeys listener;
  std::shared_ptr<net::Context> ctx;
};

const Session& session() {
  static const Session* s = [] {
    auto* out = new Session;
    auto token = net::Token::from_string(kToken);
    if (!token.ok()) std::abort();
    net::handshake::Transcript t;
    t.connector_nonce.fill(1);
    t.listener_nonce.fill(2);
    net::SharedSecret shared{};
    shared.fill(3);
    auto ck = net::derive_session_keys(*token, t, shared, true);
    auto lk = net::derive_session_keys(*token, t, shared, false);
    auto ctx = net::Context::create({.path = net::NetPath::kTcp});
    if (!ck.ok() || !lk.ok() || !ctx.ok()) std::abort();
    out->connector = *ck;
    out->listener = *lk;
    out->ctx = *ctx;
    return out;
  }();
  return *s;
}

// A frame as the channel's peer seals it (endpoint.h: length, AES-256-GCM of payload + kind,
// tag; the nonce counts the frames before it).
std::vector<std::byte> seal_frame(std::uint64_t counter, std::uint8_t kind,
                                  std::span<const std::byte> payload) {
  const auto length = static_cast<std::uint32_t>(payload.size() + 1 + net::kTagBytes);
  std::vector<std::byte> frame(4 + length);
  for (int i = 0; i < 4; ++i) frame[i] = static_cast<std::byte>(length >> (8 * i));
  std::memcpy(frame.data() + 4, payload.data(), payload.size());
  frame[4 + payload.size()] = static_cast<std::byte>(kind);
  const std::span<std::byte> plain(frame.data() + 4, payload.size() + 1);
  net::Tag tag{};
  if (!net::aead_seal(session().connector.control_send, counter,
                      std::span<const std::byte>(frame.data(), 4), plain, plain, &tag)
           .ok()) {
    std::abort();
  }
  std::memcpy(frame.data() + 4 + payload.size() + 1, tag.data(), net::kTagBytes);
  return frame;
}

struct Receive {
  std::unique_ptr<std::byte[]> buffer;
  std::size_t capacity = 0;
  net::MemoryRegion region;
  net::Transfer transfer;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const Session& s = session();
  int fds[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) return 0;
  ferry::ScopedFd peer(fds[1]);
  (void)::fcntl(fds[0], F_SETFL, O_NONBLOCK);
  (void)::fcntl(fds[1], F_SETFL, O_NONBLOCK);
  const auto marker = net::handshake::tcp_path_address();
  auto sealed = net::seal_address(marker, s.connector.address_send);
  if (!sealed.ok()) std::abort();
  auto remote = net::open_address(*sealed, s.listener.address_receive, marker, "fuzz peer");
  if (!remote.ok()) std::abort();
  auto ch = net::open_channel(s.ctx, nullptr, ferry::ScopedFd(fds[0]), "fuzz peer", *remote,
                              s.ctx->allocate_bulk_id(), 1, s.listener);
  if (!ch.ok()) std::abort();

  std::vector<Receive> receives;
  std::uint64_t frames = 0;
  const auto turn = [&] {
    (void)ch->try_receive();
    for (auto& r : receives) (void)r.transfer.done();
  };
  std::size_t at = 0;
  const auto take = [&](std::size_t n) {
    const std::size_t k = std::min(n, size - at);
    const auto* p = reinterpret_cast<const std::byte*>(data + at);
    at += k;
    return std::span<const std::byte>(p, k);
  };
  while (at < size) {
    const std::uint8_t op = data[at++] % 4;
    if (op == 0 || op == 1) {
      const auto header = take(op == 0 ? 2 : 1);
      if (header.size() < (op == 0 ? 2u : 1u)) break;
      const auto body = take(std::to_integer<std::size_t>(header.back()));
      const std::vector<std::byte> out =
          op == 0 ? seal_frame(frames++, std::to_integer<std::uint8_t>(header[0]), body)
                  : std::vector<std::byte>(body.begin(), body.end());
      // The socket buffer holds far more than an input: a short write means the channel
      // stopped reading, which the rest of this input does not change.
      (void)!::send(peer.get(), out.data(), out.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    } else if (op == 2) {
      const auto args = take(2);
      if (args.size() < 2) break;
      Receive r;
      r.capacity = 16 * std::to_integer<std::size_t>(args[1]) + 1;
      r.buffer = std::make_unique<std::byte[]>(r.capacity);
      auto region = s.ctx->register_memory(std::span<std::byte>(r.buffer.get(), r.capacity));
      if (!region.ok()) std::abort();
      r.region = std::move(*region);
      auto t = ch->receive_bulk(std::to_integer<std::uint32_t>(args[0]) % 4,
                                std::span<std::byte>(r.buffer.get(), r.capacity), r.region);
      if (!t.ok()) continue;  // a receive already posted for that key, or the channel failed
      r.transfer = std::move(*t);
      receives.push_back(std::move(r));
    } else {
      turn();
    }
  }
  // The stream ends: every receive must finish, and none may report more than it holds.
  peer.reset();
  for (int i = 0; i < 1000; ++i) turn();
  for (auto& r : receives) {
    if (!r.transfer.done()) std::abort();
    if (r.transfer.status().ok() && r.transfer.bytes() > r.capacity) std::abort();
  }
  ch->abort();
  return 0;
}
