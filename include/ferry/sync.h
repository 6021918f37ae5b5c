// Weight sync on one node: a Sender streams rounds of tensors to N Receivers
// through a shared-memory ring (docs/protocol.md has the messages).
//
//   auto sender = ferry::sync::Sender::create("@ferry-job42", options);  // trainer
//   (*sender)->accept(2);                        // two rollout processes join
//   (*sender)->send_round(weights);              // once per training step
//
//   auto rx = ferry::sync::Receiver::connect("@ferry-job42", /*receiver_id=*/0, options);
//   (*rx)->set_destination({spec, my_buffer});   // destination mode: one copy, no staging
//   (*rx)->receive_round_into();
//
// A session (the ring, the sockets) persists across rounds: nothing is created,
// faulted in or destroyed per round. A round is delivered whole or reported
// aborted: receive_round*() returns OK only after END arrived and the round
// checksum matched. After any error the session is broken: every peer is told and let
// go, and later calls return that first error. Receivers and relays then connect
// anew; the Sender need not be created again: its next accept() starts a new session on
// the same address and ring, so the next round reaches the peers that came back.
//
// Thread safety: a Sender or Receiver is used by one thread at a time.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/export.h"
#include "ferry/status.h"
#include "ferry/tensor.h"
#include "ferry/wire_protect.h"

namespace ferry::sync {

// Whether a Sender sends delta rounds (docs/delta.md): only what changed since the version
// every receiver holds, encoded per tensor, checked against a hash of each resulting tensor.
enum class DeltaMode : std::uint8_t {
  kOff,  // every round sends every byte
  kOn,   // every round that can be a delta is one
  // Dense when every peer maps the ring (shm receivers on this node: a dense round is one
  // copy, cheaper than encoding, applying and hashing a delta; no snapshot is kept).
  // With any peer over the network (a relay, a net receiver): a delta unless a sample
  // shows over 25% of 8-byte words changed or its encoded bytes exceed 0.9 of the dense
  // round's.
  kAuto,
};
// "off", "on", "auto" (CLI flags, Python's SyncOptions(delta=...)).
FERRY_EXPORT std::string_view delta_mode_name(DeltaMode mode);
// kInvalidArgument naming the text and the choices otherwise.
FERRY_EXPORT Result<DeltaMode> parse_delta_mode(std::string_view text);

// What a Sender, Receiver or Relay is given, in three parts by who reads them: SessionOptions
// every end, SenderOptions a Sender, ReceiverOptions a Receiver (and a Relay, which receives
// from its sender). SyncOptions holds all three, so one object configures any end; a field
// of another role is ignored. ferry/sync_option_fields.h lists every field of each part once,
// for the Python module and the CLI; a new field goes into one part and that part's table
// (the build fails until it does).
struct SessionOptions {
  // How long either side waits for its peer inside a round, and the sender for
  // receivers to join. verl waits 600 s; a dead peer is seen at once anyway (socket EOF).
  std::chrono::milliseconds timeout{60'000};
  // Net sessions ("host:port" addresses): the file holding the session secret, mode 0600.
  // Empty: FERRY_TOKEN, else the file FERRY_TOKEN_FILE names. Every node uses the same.
  std::string token_file;
  // Net sessions: how the bulk bytes (the tensors) travel; control messages are always
  // sealed (AES-256-GCM). A Sender (and a Relay towards net peers) protects what it sends
  // this way; a Receiver or Relay takes it as the least it accepts from its sender, and
  // fails the first bucket of a weaker session (kFailedPrecondition). kMac authenticates
  // every bucket (a tampered byte is kCorruption naming the peer and bucket), kEncrypt
  // also hides it. Default kNone: both cost a pass of AES-GCM over every byte at each end,
  // measured at 30% and 45% of a loopback round (docs/benchmarks.md); choose kMac on a
  // network you do not trust, and set it on receivers too so that they insist on it.
  // shm peers are unaffected.
  WireProtect wire_protect = WireProtect::kNone;
  // Called about every 100 ms while a Sender or Receiver waits for a peer (to
  // join, to answer, for the next round). A non-OK status ends the wait with it, as any
  // error does: the peers are told and the session breaks. The Python module checks for
  // Ctrl-C here, so a KeyboardInterrupt is not held up by a wait of minutes. Unset: no calls.
  std::function<Status()> interrupt;
};

struct SenderOptions {
  // Bytes of one bucket (one ring slot). Any tensor fits any bucket: one larger than
  // a bucket streams through it in pieces. 512 MiB matches verl's default
  // update_weights_bucket_megabytes. Must be a multiple of 16.
  std::uint64_t bucket_bytes = 512ull << 20;
  // Ring slots = buckets in flight. 2 lets the sender pack bucket i+1 while receivers
  // copy bucket i; more rarely helps because both copies are memory bound.
  std::uint32_t slots = 2;
  // XXH3-64 of every bucket, checked by each receiver before it delivers the bucket.
  // Off, the round checksum still covers the manifest and every bucket's index and size,
  // but not the bytes. Receivers follow the sender's choice.
  bool checksums = true;
  // Delta rounds (receivers follow BEGIN). On, the sender keeps a host copy
  // of every tensor it sent (the model's bytes again) and receivers in callback modes keep
  // a copy of every tensor delivered; destination-mode receivers keep nothing, but their
  // destinations must keep what the last round wrote. A round goes dense when the session
  // is new or a receiver joined since the last round.
  DeltaMode delta = DeltaMode::kOff;
  // Bounds the sender's copy: tensors past this many bytes (in round order) have none and
  // are always sent dense, inside the delta round. Default: no bound.
  std::uint64_t delta_snapshot_limit = UINT64_MAX;
  // Threads that encode a delta round's tensors; 0: hardware concurrency, at most 4.
  std::uint32_t delta_threads = 0;
};

// The default of the receiver's memory bounds (ReceiverOptions::max_ring_bytes,
// max_assembled_tensor_bytes) on a machine of `physical_bytes`: a quarter of it, at most `cap`,
// and at least 1 GiB (half the memory on a machine with less than 2 GiB), so the default is
// always below the machine's memory. E.g. 23.6 GiB gives 5.9 GiB; 512 GiB gives `cap`.
FERRY_EXPORT std::uint64_t receiver_memory_limit(std::uint64_t cap, std::uint64_t physical_bytes);
// The same for this machine: its physical memory as sysconf(_SC_PHYS_PAGES) x page size
// (MemTotal in /proc/meminfo), read on each call; `cap` when that cannot be read.
FERRY_EXPORT std::uint64_t receiver_memory_limit(std::uint64_t cap);
// This machine's physical memory in bytes, as above; 0 when it cannot be read.
FERRY_EXPORT std::uint64_t physical_memory_bytes();

struct ReceiverOptions {
  // How long a receiver waits for the next round to begin; negative waits forever,
  // since a training step may take many minutes. A dead sender still ends the wait at once.
  std::chrono::milliseconds idle_timeout{-1};
  // Net receivers: the largest ring (slots x bucket bytes) a sender's WELCOME may ask this
  // receiver to allocate and fill; a larger one is refused (kResourceExhausted naming this
  // option) before any memory is taken. Default: receiver_memory_limit(16 GiB), a quarter
  // of this machine's memory up to 16 GiB (which holds 2 slots of 8 GiB buckets), so a
  // sender cannot make a receiver fault in more than the machine has; raise it for larger
  // rings. A value set explicitly is used as given.
  std::uint64_t max_ring_bytes = receiver_memory_limit(16ull << 30);
  // Bounds a receiver's copies in callback modes (the model's bytes; see
  // SenderOptions::delta): a round whose tensors, with the copies kept from earlier rounds,
  // would pass it is refused at BEGIN (kResourceExhausted naming this option) before any of
  // it is allocated, and the session breaks as on any error. 64 GiB holds a 32B-parameter
  // model in bf16; raise it for larger ones, or receive into destinations, which keep nothing.
  std::uint64_t delta_keep_limit = 64ull << 30;
  // Bounds the one tensor larger than a bucket that a receiver in callback modes assembles
  // whole (in memory of its size, which only the sender's BEGIN gives): a round with a larger
  // one is refused at BEGIN (kResourceExhausted naming the tensor and this option) before any
  // of it is allocated. Destinations need no assembly. Default:
  // receiver_memory_limit(64 GiB), a quarter of this machine's memory up to 64 GiB; a value
  // set explicitly is used as given.
  std::uint64_t max_assembled_tensor_bytes = receiver_memory_limit(64ull << 30);
};

// Every option of every role; what Sender::create, Receiver::connect and Relay::connect
// take. Set fields by name (o.bucket_bytes = ...): it has bases, so it takes no designated
// initializers.
struct SyncOptions : SessionOptions, SenderOptions, ReceiverOptions {};

struct RoundStats {
  std::uint64_t round = 0;
  std::uint32_t tensors = 0;
  std::uint32_t buckets = 0;
  std::uint64_t bytes = 0;  // tensor bytes
  // Bytes of those this receiver delivered: `bytes`, unless its destinations are rank-local
  // slices (TensorSlice), of which only the selected bytes are copied out of the ring.
  std::uint64_t delivered_bytes = 0;
  double seconds = 0;
  std::uint64_t checksum = 0;      // the round checksum both sides agreed on
  bool more_follows = false;       // the sender's RoundOptions::more_follows for this round
  bool delta = false;              // a delta round: the wire carried encoded deltas
  std::uint64_t wire_bytes = 0;    // bytes the ring carried: `bytes` dense, encoded for a delta
  std::uint64_t base_version = 0;  // a delta's base: the version receivers held before it
  std::uint64_t version = 0;       // the version receivers hold after the round
  // The sender's RoundOptions::step for this round, as its BEGIN said; nullopt when it gave
  // none. Unlike `version` (ferry's own round count) this is the caller's number.
  std::optional<std::uint64_t> step;
};

// An update too large to hold at once (a generator of GPU tensors) is sent as several
// rounds: every round but the last says more_follows. Each round is still whole or
// aborted on its own; receivers learn where the update ends (BucketCallback's is_last).
struct RoundOptions {
  bool more_follows = false;
  // The trainer's step this round carries, e.g. verl's global_steps; travels in BEGIN and
  // comes back as every receiver's RoundStats::step. Default: none (receivers see nullopt).
  // Every round of an update streamed as several rounds carries the same step.
  std::optional<std::uint64_t> step;
};

// A tensor whose bytes lie in several places in memory: parts[0], then parts[1], ...
// ferry::convert::gather_hf_tensors cuts Hugging Face tensors out of fused Megatron
// shards this way, so the sender converts on the way without a second copy of the model.
struct GatheredTensor {
  TensorSpec spec;
  std::vector<std::span<const std::byte>> parts;  // sizes add up to spec.bytes()
};

// Completes every copy a TensorProducer started since the last flush (a device's
// synchronize); called before the bytes it wrote are hashed or sent.
using FillFlush = std::function<Status()>;

// UpdateWriter::put's producer for a tensor it does not hold in host memory (a device
// tensor): writes bytes [offset, offset + dst.size()) of the tensor into `dst`, or only
// starts that copy (a device's asynchronous D2H): `dst` is read only after the next
// UpdateOptions::flush. Called in order, never for zero bytes; a tensor is produced in
// several calls.
using TensorProducer = std::function<Status(std::uint64_t offset, std::span<std::byte> dst)>;

// Pulls an update's tensors for Sender::send_update, one per call, in the order the caller
// has them: the next tensor (its bytes exactly its spec's, valid until the next call), or
// nullopt once the update is over. An error ends the update with it.
using UpdateStream = std::function<Result<std::optional<TensorView>>()>;

struct UpdateOptions {
  // The trainer's step every round of the update carries (RoundOptions::step).
  std::optional<std::uint64_t> step;
  // A staged update's host buffer (kept by the Sender, reused by every staged update): tensors
  // are copied into it as they are pulled, and each time it is full they are sent as one round
  // (more_follows), so the stream may reuse its memory at once. Larger: fewer rounds (each
  // drains the ring once), more memory; a tensor larger than it is sent alone, uncopied, before
  // the next is pulled. Default 64 MiB.
  std::uint64_t staging_bytes = 64ull << 20;
  // Completes every copy a TensorProducer started since the last flush (a device's
  // synchronize): called before any bytes a producer wrote are hashed or sent. Needed only
  // by updates whose tensors are put with a producer.
  FillFlush flush;
};

// What send_update sent to one Sender's receivers.
struct UpdateStats {
  std::uint64_t bytes = 0;  // tensor bytes of the update
  std::uint32_t tensors = 0;
  std::uint32_t rounds = 0;
  bool streamed = false;  // one round against the last update's manifest, one copy per tensor
  double seconds = 0;     // the rounds' RoundStats::seconds, added up
  RoundStats last_round;  // the update's last round (a streamed one's only round)
};

class Sender;

// One update pushed by its caller a tensor at a time, for a caller that cannot hand over a
// stream (a coroutine that yields tensors: ferry.sync drives it from asyncio). send_update
// is a loop over it; begin_round streams one round against a manifest the caller knows.
//
//   FERRY_ASSIGN_OR_RETURN(auto update, UpdateWriter::begin(senders, options));
//   for (const TensorView& t : weights) FERRY_RETURN_IF_ERROR(update->put(t));
//   FERRY_ASSIGN_OR_RETURN(std::vector<UpdateStats> stats, update->finish());
//
// While it is open its Senders refuse every other round (kFailedPrecondition); a Sender
// destroyed meanwhile aborts it. An error of put() or finish() ends the update as
// send_update's would; so does abort(), for an error on the caller's side, and destroying
// it unfinished. Each call may come from another thread, one call at a time.
class FERRY_EXPORT UpdateWriter {
 public:
  // An update of the caller's tensors, streamed or staged as Sender::send_update chooses,
  // decided at the first put(). REQUIRES: distinct Senders, each with a receiver.
  static Result<std::unique_ptr<UpdateWriter>> begin(std::span<Sender* const> senders,
                                                     const UpdateOptions& options = {});
  // One round to `sender` streamed against `specs`, each tensor copied straight into the ring
  // as it is put (one copy, nothing held): BEGIN goes out now; a manifest naming a tensor
  // twice fails here and leaves the session intact. A tensor that differs from its spec,
  // one too many or too few fails the round naming it (the session breaks, as with any
  // failed round); finish()'s UpdateStats::last_round is the round's RoundStats. `flush`
  // as UpdateOptions::flush, for tensors put with a producer.
  static Result<std::unique_ptr<UpdateWriter>> begin_round(Sender* sender,
                                                           std::span<const TensorSpec> specs,
                                                           const RoundOptions& options = {},
                                                           FillFlush flush = {});
  ~UpdateWriter();
  UpdateWriter(const UpdateWriter&) = delete;
  UpdateWriter& operator=(const UpdateWriter&) = delete;

  // The update's next tensor (its bytes exactly its spec's), copied before it returns: the
  // caller may reuse the memory at once. May wait for a free slot.
  Status put(const TensorView& tensor);
  // The same for a tensor `produce` writes itself, straight into the ring (streamed) or the
  // staging buffer (staged), one copy; options.flush completes its copies before any of its
  // bytes are hashed. REQUIRES: options.flush set.
  Status put(const TensorSpec& spec, const TensorProducer& produce);
  // After the last tensor: the rest goes out and every receiver acknowledges. One
  // UpdateStats per Sender, in order.
  Result<std::vector<UpdateStats>> finish();
  // Ends the update with `why`, the caller's error: receivers hear it if any of the update
  // went out (the sessions then break); before that the sessions stay intact. No-op once
  // the update ended.
  void abort(const Status& why);

  struct Impl;

 private:
  explicit UpdateWriter(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

class FERRY_EXPORT Sender {
 public:
  // Binds `address` ("@name": abstract socket; else a file path created 0600) and
  // creates the ring (options.slots x options.bucket_bytes, pre-faulted).
  static Result<std::unique_ptr<Sender>> create(const std::string& address,
                                                const SyncOptions& options);
  ~Sender();
  Sender(const Sender&) = delete;
  Sender& operator=(const Sender&) = delete;

  // Waits for `receivers` more receivers to join, each within options.timeout.
  // A receiver asking for another session is told so and turned away (not counted).
  // After a failed round it first starts a new session (new id; no peers yet).
  Status accept(std::uint32_t receivers);

  // Streams one round from memory the caller owns and keeps valid until it returns.
  // REQUIRES: at least one receiver joined; names unique; data.size() == spec.bytes().
  // Returns after every receiver acknowledged the round (END and checksum matched).
  Result<RoundStats> send_round(std::span<const TensorView> weights,
                                const RoundOptions& round_options = {});
  // The same for tensors gathered from parts; a part may be empty.
  Result<RoundStats> send_round_gathered(std::span<const GatheredTensor> weights,
                                         const RoundOptions& round_options = {});
  // Sends one update, a model's tensors pulled from `next`, choosing how itself, so a caller
  // has one send path:
  // - streamed, when its first tensor matches the first of the last update this Sender sent
  //   whole with unique names: one round with that manifest, each tensor copied straight into
  //   the ring as it is pulled (one copy, nothing held). A tensor that differs from that
  //   manifest later (name, dtype, shape, one missing or extra) aborts the round with
  //   kInvalidArgument naming it, which breaks the session as any failed round; the next
  //   update is staged.
  // - staged otherwise (the first update, a manifest that changed at its first tensor, delta
  //   rounds on): each tensor is copied into the staging buffer (UpdateOptions) as it is
  //   pulled, and sent in rounds of at most staging_bytes (every round but the last says
  //   more_follows; a name pulled twice starts a new round, so receivers end with the later).
  //   Its manifest, if names were unique, is what the next update streams against.
  // An error from `next` before anything was sent leaves the session intact; any later one
  // aborts the update's round (the session breaks) and is returned.
  // REQUIRES: a receiver joined, as for send_round.
  Result<UpdateStats> send_update(const UpdateStream& next, const UpdateOptions& options = {});
  // The same update to several Senders (one per kind of peer, e.g. an shm and a net session)
  // from one stream: each tensor is pulled once and copied once for all of them. Streamed
  // only when every Sender's last update had the same manifest. An error breaks every
  // session. One UpdateStats per Sender, in order. REQUIRES: distinct Senders.
  static Result<std::vector<UpdateStats>> send_update(std::span<Sender* const> senders,
                                                      const UpdateStream& next,
                                                      const UpdateOptions& options = {});
  // The manifest send_update streams the next update against: the last update it sent whole
  // with unique names; nullopt before one and after any failed round. Valid until the next
  // call on this Sender.
  const std::optional<std::vector<TensorSpec>>& update_manifest() const;
  // The whole ring (options.slots x options.bucket_bytes), for a producer that registers it
  // with a device runtime once (page-locked, so a TensorProducer's D2H copies into it are DMA).
  // The memory lives as long as the Sender; it is written only while a round is sent.
  std::span<std::byte> ring_memory() const;

  std::uint64_t session_id() const;
  std::uint64_t rounds_sent() const;
  std::uint32_t receivers() const;
  const std::string& address() const;

  struct Impl;

 private:
  friend class UpdateWriter;
  explicit Sender(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Per-tensor delivery: a zero-copy view into the ring when the tensor lies in one
// bucket, or a view of an assembled copy when it spans several. Valid during the call only.
using TensorCallback = std::function<Status(const TensorView& tensor)>;
// verl's per-bucket delivery: the tensors that complete in this bucket; is_last on
// the update's final bucket: the last bucket of a round without more_follows (an
// empty such round calls it once, with no tensors). Views are valid during the call only.
using BucketCallback = std::function<Status(std::span<const TensorView> weights, bool is_last)>;
// Writable per-bucket delivery (Receiver::receive_round_buckets_writable): as BucketCallback,
// but the views are writable and outlive the call, until the callback for the round's next
// bucket returns; round_ends marks the round's last bucket, whose views are valid during the
// call only (its slot is released when it returns, as the round's ACK needs).
using WritableBucketCallback = std::function<Status(std::span<const MutableTensorView> weights,
                                                    bool is_last, bool round_ends)>;
// Writable per-segment delivery (Receiver::receive_round_segments_writable): the writable
// views of the tensors that complete in one segment (at most 16 MiB of a bucket),
// handed out as soon as that segment is verified, so the caller copies a bucket while the
// sender still fills it. Called for every segment that completes a tensor and for every
// bucket's last segment (tensors may then be empty). A view stays valid as in the bucket
// mode: until the call for the round's next bucket's last segment returns; a view of the
// round's last bucket until the call for that bucket's last segment returns.
struct WritableSegment {
  std::span<const MutableTensorView> tensors;  // completed in this segment, in send order
  bool bucket_ends = false;                    // the bucket's last segment
  bool is_last = false;     // the update's last segment: round_ends without more_follows
  bool round_ends = false;  // the round's last segment (an empty round: its only call)
};
using WritableSegmentCallback = std::function<Status(const WritableSegment& segment)>;

// What a round's BEGIN announces, before any of the round is delivered.
struct RoundBegin {
  std::uint64_t round = 0;  // the sender's round number: the round's RoundStats::version
  bool more_follows = false;
  std::span<const TensorSpec> tensors;  // what the round delivers (a delta round's targets)
  std::optional<std::uint64_t> step;    // the sender's RoundOptions::step, if it gave one
};
// Checks a round as it begins; an error aborts it (MultiReceiver's checks across senders).
using BeginCheck = std::function<Status(const RoundBegin& begin)>;

// How a round read with Receiver::begin_round reaches the caller.
enum class ReadInto : std::uint8_t {
  // Read-only views: into the ring where a tensor lies in one bucket (zero copy), else of the
  // tensor assembled in this process (a delta round: of the copies its payloads decode onto).
  kViews,
  // The same views, writable: a copy-on-write mapping of the ring (writable_views_error();
  // receive_round_buckets_writable says what the caller may do with them).
  kWritableViews,
  // Copied into the registered destinations (set_destination) while the bytes are hashed;
  // the segments carry no views.
  kDestinations,
  // A relay's: received and verified, not delivered (Receiver refuses it).
  kPassThrough,
};

// One verified segment of a round read with Receiver::next_segment(). Its views, and those of
// the bucket's earlier segments, stay valid until the bucket is released.
struct ReadSegment {
  std::uint32_t bucket = 0;
  std::span<const TensorView> tensors;          // kViews: the tensors completed here
  std::span<const MutableTensorView> writable;  // kWritableViews: the same, writable
  bool bucket_ends = false;                     // the bucket's last segment: release it
  bool round_ends = false;                      // the round's last segment
  bool is_last = false;                         // round_ends and no more_follows
};

class FERRY_EXPORT Receiver {
 public:
  // Connects (retrying until options.timeout while the sender is not up yet), says
  // HELLO and maps the ring read-only. `session` 0 joins whatever session the
  // sender runs; another value must match it.
  static Result<std::unique_ptr<Receiver>> connect(const std::string& address,
                                                   std::uint32_t receiver_id,
                                                   const SyncOptions& options,
                                                   std::uint64_t session = 0);
  ~Receiver();
  Receiver(const Receiver&) = delete;
  Receiver& operator=(const Receiver&) = delete;

  // Destination mode: where tensor `destination.spec.name` goes. The memory must stay
  // valid while rounds are received. Replaces an earlier registration of the name.
  Status set_destination(MutableTensorView destination);
  // Rank-local destination mode: tensor `slice.whole.name` goes into `local` (slice.local's
  // bytes), of which only the bytes the slice's runs select are copied; the rest of the round's
  // bytes are checked (checksums) but not copied. Replaces an earlier registration of the name.
  // ferry/vllm_slices.h gives a vLLM rank's slices.
  Status set_destination(const TensorSlice& slice, std::span<std::byte> local);
  void clear_destinations();

  // Called with each round's BEGIN before any of the round is delivered; an error aborts
  // the round with it, as any error does (the sender is told, the session breaks).
  void set_begin_check(BeginCheck check);

  // Refuses (kFailedPrecondition at its BEGIN, before any of it is delivered; the sender's
  // round fails with the reason) every later round whose step (RoundOptions::step) is below
  // `step`. The receiver raises this minimum by itself to each step it receives, so within
  // a session a stale trainer is refused without it; a caller that knows more (the step it
  // waits for, the last step of an earlier session) sets it. Rounds without a step pass.
  void set_min_step(std::uint64_t step);

  // The pull form of a round, which the receive_round* calls below are loops over: the caller
  // asks for each verified segment and hands each bucket's slot back when done with it.
  //
  //   FERRY_ASSIGN_OR_RETURN(RoundBegin begin, rx->begin_round(ReadInto::kViews));
  //   while (true) {
  //     FERRY_ASSIGN_OR_RETURN(std::optional<ReadSegment> s, rx->next_segment());
  //     if (!s) break;  // the END matched every bucket and was acknowledged: round_stats()
  //     use(s->tensors);
  //     if (s->bucket_ends) FERRY_RETURN_IF_ERROR(rx->release(s->bucket));
  //   }
  //
  // begin_round waits (options.idle_timeout) for the next round's BEGIN and checks it (the
  // begin check, the minimum step, the limits); kDestinations also resolves the registered
  // destinations. While a bucket is held the sender cannot refill its slot, so a caller that
  // holds a bucket while asking for the next needs a ring of 2 slots or more. A bucket not
  // released by the round's END is released then. Any error but a release out of order
  // breaks the session as the receive_round* calls' errors do (the sender is told why).
  Result<RoundBegin> begin_round(ReadInto into);
  Result<std::optional<ReadSegment>> next_segment();
  // Hands bucket `bucket`'s slot back to the sender (its views end); in bucket order.
  Status release(std::uint32_t bucket);
  // Breaks the session with the caller's reason (the sender's round fails naming it); returns
  // the error as the sender hears it ("round N aborted: <why>").
  Status abort(Status why);
  // The last round read to its end (next_segment() returned nullopt).
  const RoundStats& round_stats() const;

  // Receives one round into the registered destinations. Every tensor of the round
  // must have a destination of the same dtype and shape; otherwise the error lists
  // each mismatch and nothing is written. Destinations the round lacks are left alone.
  Result<RoundStats> receive_round_into();
  Result<RoundStats> receive_round(const TensorCallback& on_tensor);
  Result<RoundStats> receive_round_buckets(const BucketCallback& on_bucket);
  // Bucket mode with writable views, for callers that may write into what they receive
  // (verl's contract) without a copy: each view is a copy-on-write mapping of the ring, so
  // reading it copies nothing and writing it copies only the pages written, into this
  // process; the ring, the sender and the other receivers never see the writes. The pages
  // written are dropped before the slot is handed out again, so every round shows its own
  // bytes. Holding a bucket's views until the next bucket's callback returns keeps one ring
  // slot from the sender, so this mode needs a ring of at least 2 slots. Fails with
  // kFailedPrecondition (before the round starts, the session intact) where
  // writable_views_error() is not OK, and fails a delta round (the session breaks): delta
  // rounds are received with receive_round_buckets.
  Result<RoundStats> receive_round_buckets_writable(const WritableBucketCallback& on_bucket);
  // The same views per segment instead of per bucket (WritableSegmentCallback), with the same
  // lifetimes, release and preconditions: a tensor reaches the caller as soon as the segment
  // completing it arrived, not once its whole bucket did.
  Result<RoundStats> receive_round_segments_writable(const WritableSegmentCallback& on_segment);
  // OK when the writable modes can run: the ring has 2 slots or more, its
  // bucket size is a multiple of the page size and the kernel allowed the private mapping
  // (made on the first call, then kept). Otherwise the reason; callers then copy.
  Status writable_views_error();
  // The ring as this process maps it (read-only where the sender shares its memory), for a
  // caller that page-locks it with a device runtime once so copies out of it are DMA. Valid
  // until the Receiver is destroyed.
  std::span<const std::byte> ring_memory() const;
  // The sender's ring slots: buckets in flight. A caller of the pull form can hold a bucket
  // while it asks for the next only with 2 or more.
  std::uint32_t ring_slots() const;

  std::uint64_t session_id() const;
  std::uint64_t last_round() const;

  struct Impl;

 private:
  explicit Receiver(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// On a receiving node: joins a net Sender as one of its receivers, receives each segment
// once from the network straight into this node's shm ring, and republishes it to the
// node's local Receivers. They connect to `local_address` exactly as to a Sender (same
// API, same session id and rounds), so one network copy serves all of them:
//
//   auto relay = ferry::sync::Relay::connect("10.0.0.1:5555", /*relay_id=*/1,
//                                            "@ferry-job42", options);
//   (*relay)->accept(2);                          // this node's two rollout processes
//   while (...) (*relay)->relay_round();          // one call per round
//
// `local_address` may be on any transport (a "host:port" serves local receivers over the
// network); `upstream` on any but shm, since a relay serves a ring of its own.
//
// Relays may also feed relays (a chain or tree; ferry/relay_topology.h picks one), so the
// sender's link carries each byte once whatever the node count: a relay given a
// `relays_address` ("host:port") serves downstream relays there, which connect to it exactly
// as to a Sender, and forwards each segment to them as soon as it has it, while its local
// receivers copy it.
//
// The sender's RELEASE of a bucket waits until every local receiver and downstream relay
// released it, and its ACK until every one acknowledged the round, so a slow or dead peer
// anywhere below is reported upstream by name (a relay's error carries its own id and the
// peer's). A relay that dies mid-round aborts the round for everyone; its downstream relays
// see their upstream gone. Errors break the session, as for Sender and Receiver.
class FERRY_EXPORT Relay {
 public:
  // `relays_address`: where downstream relays join (port 0: any; see relays_address()); empty:
  // none are served.
  static Result<std::unique_ptr<Relay>> connect(const std::string& upstream, std::uint32_t relay_id,
                                                const std::string& local_address,
                                                const SyncOptions& options,
                                                const std::string& relays_address = "");
  ~Relay();
  Relay(const Relay&) = delete;
  Relay& operator=(const Relay&) = delete;

  // Waits for `local_receivers` more local receivers, then `downstream_relays` more relays
  // (which needs a relays_address), each within options.timeout. Either count may be 0.
  Status accept(std::uint32_t local_receivers, std::uint32_t downstream_relays = 0);
  // Waits for the next round (options.idle_timeout) and forwards it whole.
  Result<RoundStats> relay_round();

  std::uint64_t session_id() const;
  const std::string& local_address() const;
  // Where downstream relays join ("10.0.0.2:40123" for a port 0); empty when none are served.
  const std::string& relays_address() const;

  struct Impl;

 private:
  explicit Relay(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace ferry::sync
