// Feeds arbitrary bytes to the net handshake's ADDRESS frame: its parser, its tag check and
// the worker address's shape check (seal.h: open_address), which an authenticated peer, or
// anyone on the path, can aim at. They must never crash, and never let through what they
// should not. The first byte picks what the rest is:
//   even: an ADDRESS frame as it arrives. What opens must be what sealing its address gives
//         (sealing is deterministic: one key, counter 0) and must pass the shape check.
//   odd:  a worker address, sealed here with the session key (a token holder's garbage): it
//         opens exactly when check_worker_address accepts it, to the same bytes; and with
//         any one bit of the frame flipped (the next byte says which) it never opens.
// Seeds: fuzz/corpus/transport_address_frame_fuzz/ (fuzz/seeds/address_frame_seeds.py).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>
#include <vector>

#include "transport/net/auth.h"
#include "transport/net/seal.h"

namespace net = ferry::net;
namespace hs = ferry::net::handshake;

namespace {

// The session of the seeds: a fixed token of `ferry token new`'s kind, connector nonce all
// 0x01, listener nonce all 0x02, public keys all 0x04 and 0x05, ephemeral secret all 0x03;
// the frames are the connector's.
constexpr const char* kToken = "595e0ea72283ceaab9fff7db4dce494ff27fb0f69d2243874ffce94b5e27303f";
struct Session {
  net::SessionKeys connector;
  net::SessionKeys listener;
  std::vector<std::byte> local;  // "this process's" worker address: UCX 1.13's version 0
};

const Session& session() {
  static const Session* s = [] {
    auto* out = new Session;
    auto token = net::Token::from_string(kToken);
    if (!token.ok()) std::abort();
    hs::Transcript t;
    t.connector_nonce.fill(1);
    t.listener_nonce.fill(2);
    t.connector_key.fill(4);
    t.listener_key.fill(5);
    net::SharedSecret shared{};
    shared.fill(3);
    auto ck = net::derive_session_keys(*token, t, shared, true);
    auto lk = net::derive_session_keys(*token, t, shared, false);
    if (!ck.ok() || !lk.ok()) std::abort();
    out->connector = *ck;
    out->listener = *lk;
    out->local.assign(64, std::byte{0x5a});
    out->local[0] = std::byte{0x20};  // version 0, a flag above
    return out;
  }();
  return *s;
}

bool same(std::span<const std::byte> a, std::span<const std::byte> b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin());
}

void as_frame(std::span<const std::byte> in) {
  const Session& s = session();
  auto opened = net::open_address(in, s.listener.address_receive, s.local, "peer");
  if (!opened.ok()) return;
  if (!hs::check_worker_address(opened->bytes(), s.local, "peer").ok()) std::abort();
  auto again = net::seal_address(opened->bytes(), s.connector.address_send);
  if (!again.ok() || !same(*again, in)) std::abort();
}

void as_address(std::span<const std::byte> in) {
  const Session& s = session();
  const std::size_t flip = in.empty() ? 0 : std::to_integer<std::size_t>(in[0]);
  const auto worker = in.empty() ? in : in.subspan(1);
  auto sealed = net::seal_address(worker, s.connector.address_send);
  if (!sealed.ok()) {  // sealing refuses only sizes no frame may carry
    if (worker.size() >= hs::kMinWorkerAddressBytes &&
        worker.size() <= hs::kMaxWorkerAddressBytes) {
      std::abort();
    }
    return;
  }
  auto opened = net::open_address(*sealed, s.listener.address_receive, s.local, "peer");
  const bool shape_ok = hs::check_worker_address(worker, s.local, "peer").ok();
  if (opened.ok() != shape_ok) std::abort();
  if (opened.ok() && !same(opened->bytes(), worker)) std::abort();
  // Reflected (our own receive key) or one bit flipped: never opens.
  if (net::open_address(*sealed, s.connector.address_receive, s.local, "peer").ok()) std::abort();
  auto bad = *sealed;
  bad[(flip * 7919) % bad.size()] ^= std::byte{static_cast<unsigned char>(1u << (flip % 8))};
  if (net::open_address(bad, s.listener.address_receive, s.local, "peer").ok()) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::span<const std::byte> in(reinterpret_cast<const std::byte*>(data) + 1, size - 1);
  if ((data[0] & 1) == 0) {
    as_frame(in);
  } else {
    as_address(in);
  }
  return 0;
}
