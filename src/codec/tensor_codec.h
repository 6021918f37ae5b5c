// The seam for per-tensor transforms of a round (docs/architecture.md, "Codecs"): a sender's
// codec encodes the round's tensors into U8 payloads, BEGIN names the codec and, per tensor,
// the target the payload decodes into, and each receiver decodes the payloads with the codec
// of that id. The round in between (buckets, ring, checksums, relays) carries the payloads
// as it carries any tensor and knows no codec.
//
// A codec is round-level on the send side because its choices are: delta keeps a snapshot
// of what every receiver holds, and decides per round whether encoding pays. On the receive
// side it is one function: decode a payload onto a tensor's bytes.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "ferry/status.h"
#include "ferry/sync.h"
#include "ferry/tensor.h"
#include "wire/message.h"

namespace ferry::codec {

// A round as a codec prepared it.
struct EncodedRound {
  std::uint8_t codec = wire::kDense;  // kDense: the caller's tensors go as they are
  // Later rounds may decode onto this one's tensors (BEGIN's keep_copies): receivers that
  // hand out views keep a copy of them.
  bool keep_copies = false;
  // Encoded: one U8 payload per tensor, named like it (parts may point into the codec's
  // buffers and into the caller's bytes), and what each decodes into.
  std::vector<sync::GatheredTensor> payloads;
  std::vector<wire::CodecTarget> targets;
  std::uint64_t base_version = 0;  // what receivers must hold to decode; 0: nothing
  std::uint64_t encoded_bytes = 0;
};

// A Sender's codec, one per session. Calls come from the sender's thread, round by round:
// encode, then round_sent once the round is over (or failed).
class SendCodec {
 public:
  virtual ~SendCodec() = default;

  // Prepares a round of `tensors` (their sizes and names are the codec's to check).
  // `all_peers_share_memory`: every peer maps the ring, so no link saves bytes. `tensors`
  // and their bytes must stay until round_sent().
  virtual Result<EncodedRound> encode(std::span<const sync::GatheredTensor> tensors,
                                      bool all_peers_share_memory) = 0;
  // The round encode() prepared is over: acknowledged by every receiver at `version` when
  // `ok`, else failed (receivers hold nothing known).
  virtual void round_sent(bool ok, std::uint64_t version) = 0;
  // A receiver joined or the session restarted: it holds nothing yet.
  virtual void reset() = 0;
};

// Decodes the payloads of a codec's rounds on a receiver.
class ReceiveCodec {
 public:
  virtual ~ReceiveCodec() = default;
  virtual std::string_view name() const = 0;
  // Whether a payload decodes onto the tensor's bytes at BEGIN's base version (delta): the
  // receiver must then hold that version.
  virtual bool decodes_onto_base() const = 0;
  // Decodes `payload` (from a peer: validated before any write, so `onto` is unchanged on
  // error) into `onto`, the target's bytes. Errors are kCorruption naming `what`.
  virtual Status decode(std::span<const std::byte> payload, std::span<std::byte> onto,
                        std::string_view what) const = 0;
};

}  // namespace ferry::codec
