#include "wire/message.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>

#include "base/file_util.h"
#include "support/status_matchers.h"
#include "wire/conversation.h"

namespace ferry::wire {
namespace {

Message make(std::uint64_t session, std::uint64_t round, Body body) {
  Message m;
  m.session = session;
  m.round = round;
  m.body = std::move(body);
  return m;
}

Begin small_begin() {
  Begin b;
  b.bucket_bytes = 1024;
  b.manifest.push_back(*TensorSpec::make("model.embed_tokens.weight", DType::kBF16, {8, 4}));
  b.manifest.push_back(*TensorSpec::make("scalar", DType::kF32, {}));
  b.manifest.push_back(*TensorSpec::make("packed", DType::kF4, {6}));
  b.total_bytes = 64 + 4 + 3;
  b.bucket_count = 1;
  return b;
}

TEST(WireMessage, EveryTypeRoundTrips) {
  std::vector<Message> all = {
      make(0, 0, Hello{3, 1234}),
      make(7, 2, Welcome{2, 4096, 1}),
      make(7, 3, small_begin()),
      make(7, 3, Filled{1, 5, 100, 0xdeadbeefcafef00dULL}),
      make(7, 3, Release{1, 5}),
      make(7, 3, End{6, 42}),
      make(7, 3, Ack{6, 42}),
      make(7, 3, Error{Code::kCorruption, "bucket 5 checksum mismatch"}),
  };
  for (const Message& m : all) {
    auto bytes = encode(m);
    auto back = decode(bytes, "test peer");
    ASSERT_OK(back) << m.describe() << ": " << back.status().to_string();
    EXPECT_EQ(back->type(), m.type());
    EXPECT_EQ(back->session, m.session);
    EXPECT_EQ(back->round, m.round);
    EXPECT_EQ(encode(*back), bytes) << m.describe();
  }
  auto b = decode(encode(all[2]), "p");
  ASSERT_OK(b);
  EXPECT_EQ(std::get<Begin>(b->body).manifest, small_begin().manifest);
}

TEST(WireMessage, LayoutIsLittleEndianAndFixed) {
  auto bytes = encode(make(0x0102030405060708ULL, 9, Release{0x11, 0x22}));
  ASSERT_EQ(bytes.size(), kHeaderBytes + 8);
  EXPECT_EQ(bytes[0], std::byte{'F'});
  EXPECT_EQ(bytes[3], std::byte{'1'});
  EXPECT_EQ(bytes[6], std::byte{5});   // RELEASE
  EXPECT_EQ(bytes[8], std::byte{8});   // body length
  EXPECT_EQ(bytes[12], std::byte{8});  // lowest byte of the session first
  EXPECT_EQ(bytes[19], std::byte{1});
  EXPECT_EQ(bytes[20], std::byte{9});
  EXPECT_EQ(bytes[28], std::byte{0x11});
}

Begin delta_begin() {
  Begin b;
  b.bucket_bytes = 1024;
  b.manifest.push_back(*TensorSpec::make("w", DType::kU8, {50}));
  b.manifest.push_back(*TensorSpec::make("b", DType::kU8, {44}));
  b.total_bytes = 94;
  b.bucket_count = 1;
  b.keep_copies = 1;
  b.codec = 1;
  b.base_version = 4;
  b.version = 5;
  b.targets.push_back({*TensorSpec::make("w", DType::kBF16, {8, 4}), 0x1122334455667788ULL});
  b.targets.push_back({*TensorSpec::make("b", DType::kF32, {3}), 42});
  return b;
}

TEST(WireMessage, DeltaBeginRoundTrips) {
  const Message m = make(7, 5, delta_begin());
  auto back = decode(encode(m), "p");
  ASSERT_OK(back);
  const auto& b = std::get<Begin>(back->body);
  EXPECT_EQ(b.codec, 1);
  EXPECT_EQ(b.keep_copies, 1);
  EXPECT_EQ(b.base_version, 4u);
  EXPECT_EQ(b.version, 5u);
  ASSERT_EQ(b.targets.size(), 2u);
  EXPECT_EQ(b.targets[0].spec, delta_begin().targets[0].spec);
  EXPECT_EQ(b.targets[0].hash, 0x1122334455667788ULL);
  EXPECT_EQ(b.targets[1].spec.name, "b");
  // Every truncation of a delta BEGIN is refused too.
  const auto bytes = encode(m);
  for (std::size_t n = 0; n < bytes.size(); ++n) {
    EXPECT_FALSE(decode(std::span(bytes).first(n), "p").ok()) << n;
  }
}

TEST(WireDecoder, RejectsInconsistentDeltaFields) {
  auto message_of = [](Begin b) { return decode(encode(make(7, 5, std::move(b))), "sender"); };
  Begin backwards = delta_begin();
  backwards.base_version = 5;
  EXPECT_NE(message_of(backwards).status().message().find("from version 5 to version 5"),
            std::string::npos);
  Begin not_blob = delta_begin();
  not_blob.manifest[0] = *TensorSpec::make("w", DType::kBF16, {25});
  EXPECT_NE(message_of(not_blob).status().message().find("payload 'w'"), std::string::npos);
  Begin dense_with_base = small_begin();
  dense_with_base.base_version = 3;
  EXPECT_NE(message_of(dense_with_base).status().message().find("dense round names base"),
            std::string::npos);
}

TEST(WireDecoder, RejectsEveryTruncation) {
  auto bytes = encode(make(7, 3, small_begin()));
  for (std::size_t n = 0; n < bytes.size(); ++n) {
    auto r = decode(std::span(bytes).first(n), "receiver 2");
    ASSERT_FALSE(r.ok()) << n;
    EXPECT_EQ(r.status().code(), Code::kCorruption);
    EXPECT_NE(r.status().message().find("receiver 2"), std::string::npos) << r.status().message();
  }
}

TEST(WireDecoder, RejectsBadHeaderFields) {
  const auto good = encode(make(7, 3, Release{1, 1}));
  auto with = [&](std::size_t at, std::uint8_t v) {
    auto b = good;
    b[at] = std::byte{v};
    return decode(b, "sender");
  };
  EXPECT_NE(with(0, 'X').status().message().find("magic"), std::string::npos);
  // A peer of version 4 (before BEGIN's step) is told which versions differ.
  EXPECT_NE(with(4, 4).status().message().find("protocol version 4, this build speaks 5"),
            std::string::npos)
      << with(4, 4).status().message();
  EXPECT_NE(with(6, 0).status().message().find("unknown message type 0"), std::string::npos);
  EXPECT_NE(with(6, 9).status().message().find("unknown message type 9"), std::string::npos);
  EXPECT_NE(with(7, 1).status().message().find("RELEASE message from sender: unknown flags"),
            std::string::npos);
  // Body length larger than what arrived, and over the hard limit.
  EXPECT_NE(with(8, 9).status().message().find("header says 9"), std::string::npos);
  EXPECT_NE(with(11, 0x40).status().message().find("exceeds the limit"), std::string::npos);
  // Trailing garbage after a fixed-size body.
  auto longer = good;
  longer.push_back(std::byte{0});
  longer[8] = std::byte{9};
  EXPECT_NE(decode(longer, "sender").status().message().find("expected 8"), std::string::npos);
}

TEST(WireDecoder, RejectsLyingManifest) {
  Begin b = small_begin();
  b.total_bytes += 1;
  auto r = decode(encode(make(7, 3, b)), "sender");
  EXPECT_NE(r.status().message().find("total_bytes"), std::string::npos);
  // A count of tensors that cannot fit in the bytes given is rejected before allocating.
  auto bytes = encode(make(7, 3, small_begin()));
  bytes[kHeaderBytes + 21] = std::byte{0xff};
  bytes[kHeaderBytes + 22] = std::byte{0xff};
  bytes[kHeaderBytes + 23] = std::byte{0xff};
  r = decode(bytes, "sender");
  EXPECT_NE(r.status().message().find("manifest claims"), std::string::npos)
      << r.status().message();
  // Unknown dtype in the manifest.
  bytes = encode(make(7, 3, small_begin()));
  const std::size_t dtype_at = kHeaderBytes + 25 + 2 + 25;
  bytes[dtype_at] = std::byte{99};
  r = decode(bytes, "sender");
  EXPECT_NE(r.status().message().find("dtype value 99"), std::string::npos) << r.status().message();
}

TEST(WireDecoder, MoreFollowsRoundTripsAndIsABoolean) {
  Begin b = small_begin();
  b.more_follows = 1;
  auto bytes = encode(make(7, 3, b));
  auto r = decode(bytes, "sender");
  ASSERT_OK(r);
  EXPECT_EQ(std::get<Begin>(r->body).more_follows, 1);
  bytes[kHeaderBytes + 20] = std::byte{2};  // after bucket_bytes, total_bytes, bucket_count
  r = decode(bytes, "sender");
  EXPECT_NE(r.status().message().find("more_follows is 2"), std::string::npos)
      << r.status().message();
}

TEST(WireMessage, StepRoundTripsWhenGivenAndOnlyThen) {
  for (const std::optional<std::uint64_t> step :
       {std::optional<std::uint64_t>(), std::optional<std::uint64_t>(0),
        std::optional<std::uint64_t>(7), std::optional<std::uint64_t>(UINT64_MAX)}) {
    for (Begin b : {small_begin(), delta_begin()}) {
      b.step = step;
      const auto bytes = encode(make(7, 5, b));
      auto r = decode(bytes, "sender");
      ASSERT_OK(r);
      EXPECT_EQ(std::get<Begin>(r->body).step, step);
      EXPECT_EQ(encode(*r), bytes);
    }
  }
}

TEST(WireDecoder, RejectsAStepFlagOtherThan0Or1AndAValueWithoutTheFlag) {
  // A dense BEGIN ends with the step: u8 flag, u64 value.
  Begin b = small_begin();
  b.step = 3;
  auto bytes = encode(make(7, 3, b));
  const std::size_t flag_at = bytes.size() - 9;
  ASSERT_EQ(bytes[flag_at], std::byte{1});
  ASSERT_EQ(bytes[flag_at + 1], std::byte{3});
  bytes[flag_at] = std::byte{2};
  auto r = decode(bytes, "sender");
  EXPECT_EQ(r.status().code(), Code::kCorruption);
  EXPECT_NE(r.status().message().find("BEGIN message from sender: step flag 2 with step 3"),
            std::string::npos)
      << r.status().message();
  bytes[flag_at] = std::byte{0};  // "no step", yet a value
  r = decode(bytes, "sender");
  EXPECT_NE(r.status().message().find("step flag 0 with step 3"), std::string::npos)
      << r.status().message();
  // A BEGIN of version 4's layout (no step at all) is short by the step's 9 bytes.
  bytes = encode(make(7, 3, small_begin()));
  bytes.resize(bytes.size() - 9);
  bytes[8] = static_cast<std::byte>(static_cast<std::uint8_t>(bytes[8]) - 9);
  EXPECT_EQ(decode(bytes, "sender").status().code(), Code::kCorruption);
}

// The fuzz seeds are encoded messages: a codec change (a new kVersion, a new field) must
// rewrite them, or the fuzzers start from bytes every decode refuses.
TEST(WireDecoder, DecodesEveryFuzzSeed) {
  const std::string root = std::string(FERRY_SOURCE_DIR) + "/fuzz/corpus/";
  int seeds = 0;
  for (const auto& entry : std::filesystem::directory_iterator(root + "wire_decoder_fuzz")) {
    auto text = read_file(entry.path().string());
    ASSERT_OK(text);
    const auto* data = reinterpret_cast<const std::byte*>(text->data());
    auto m = decode(std::span(data, text->size()), entry.path().filename().string());
    EXPECT_OK(m) << m.status().to_string();
    ++seeds;
  }
  EXPECT_GE(seeds, 8);
  // wire_conversation_fuzz's records: u8 side, u16 length, a message of this version.
  for (const auto& entry : std::filesystem::directory_iterator(root + "wire_conversation_fuzz")) {
    auto text = read_file(entry.path().string());
    ASSERT_OK(text);
    const std::string& s = *text;
    for (std::size_t at = 0; at + 3 <= s.size();) {
      const std::size_t len = static_cast<std::uint8_t>(s[at + 1]) |
                              (static_cast<std::size_t>(static_cast<std::uint8_t>(s[at + 2])) << 8);
      ASSERT_LE(at + 3 + len, s.size()) << entry.path();
      if (len >= kHeaderBytes && s.compare(at + 3, 4, "FRY1") == 0) {
        const unsigned version = static_cast<std::uint8_t>(s[at + 7]) |
                                 (static_cast<unsigned>(static_cast<std::uint8_t>(s[at + 8])) << 8);
        EXPECT_EQ(version, kVersion) << entry.path() << " at byte " << at;
      }
      at += 3 + len;
    }
  }
}

TEST(WireDecoder, RejectsOddSubByteTensorAndUnknownErrorCode) {
  Begin b = small_begin();
  b.manifest[2].shape = {5};  // 5 F4 values do not fill whole bytes
  b.total_bytes = 64 + 4 + 2;
  auto r = decode(encode(make(7, 3, b)), "sender");
  EXPECT_FALSE(r.ok());
  auto e = encode(make(7, 3, Error{Code::kCorruption, "x"}));
  e[kHeaderBytes] = std::byte{200};
  EXPECT_NE(decode(e, "sender").status().message().find("unknown status code"), std::string::npos);
}

// --- Conversation: order and staleness ---------------------------------------------------

struct Pair {
  Conversation sender{Conversation::Role::kSender, "receiver 1", 0xabc};
  Conversation receiver{Conversation::Role::kReceiver, "sender", 0};
  // Delivers m from one side to the other through encode/decode.
  Status sender_to_receiver(const Message& m) {
    sender.sent(m);
    auto d = decode(encode(m), "sender");
    if (!d.ok()) return d.status();
    return receiver.received(*d);
  }
  Status receiver_to_sender(const Message& m) {
    receiver.sent(m);
    auto d = decode(encode(m), "receiver 1");
    if (!d.ok()) return d.status();
    return sender.received(*d);
  }
  // HELLO, WELCOME (2 slots of 1 KiB), then round 1's BEGIN of `buckets` buckets.
  Status start_round(std::uint32_t buckets) {
    Status s = receiver_to_sender(make(0, 0, Hello{1, 1}));
    if (s.ok()) s = sender_to_receiver(make(0xabc, 0, Welcome{2, 1024, 1}));
    Begin b = small_begin();
    b.bucket_count = buckets;
    if (s.ok()) s = sender_to_receiver(make(0xabc, 1, b));
    return s;
  }
};

TEST(WireConversation, AWholeRoundIsAccepted) {
  Pair p;
  ASSERT_OK(p.receiver_to_sender(make(0, 0, Hello{1, 1})));
  ASSERT_OK(p.sender_to_receiver(make(0xabc, 0, Welcome{2, 1024, 1})));
  for (std::uint64_t round = 1; round <= 2; ++round) {
    Begin b = small_begin();
    b.bucket_count = 3;
    ASSERT_OK(p.sender_to_receiver(make(0xabc, round, b)));
    // Two slots: bucket 2 may come once bucket 0 went back.
    ASSERT_OK(p.sender_to_receiver(make(0xabc, round, Filled{0, 0, 10, 0})));
    ASSERT_OK(p.sender_to_receiver(make(0xabc, round, Filled{1, 1, 10, 0})));
    ASSERT_OK(p.receiver_to_sender(make(0xabc, round, Release{0, 0})));
    ASSERT_OK(p.sender_to_receiver(make(0xabc, round, Filled{0, 2, 10, 0})));
    ASSERT_OK(p.sender_to_receiver(make(0xabc, round, End{3, 5})));
    for (std::uint32_t i = 1; i < 3; ++i) {
      ASSERT_OK(p.receiver_to_sender(make(0xabc, round, Release{i % 2, i})));
    }
    ASSERT_OK(p.receiver_to_sender(make(0xabc, round, Ack{3, 5})));
  }
}

// A sender may not refill a slot its receiver still holds: the receiver (a relay's local
// receivers behind it) may be reading it, and over a network the bytes land in it.
TEST(WireConversation, ABucketIntoASlotNotYetReleasedIsRejected) {
  Pair p;
  ASSERT_OK(p.start_round(4));
  ASSERT_OK(p.sender_to_receiver(make(0xabc, 1, Filled{0, 0, 10, 0})));
  ASSERT_OK(p.sender_to_receiver(make(0xabc, 1, Filled{1, 1, 10, 0})));
  const Status early = p.receiver.received(make(0xabc, 1, Filled{0, 2, 10, 0}));
  EXPECT_EQ(early.code(), Code::kCorruption);
  EXPECT_NE(early.message().find("bucket 2 sent into slot 0 while bucket 0 still holds it"),
            std::string::npos)
      << early.to_string();
  ASSERT_OK(p.receiver_to_sender(make(0xabc, 1, Release{0, 0})));
  ASSERT_OK(p.sender_to_receiver(make(0xabc, 1, Filled{0, 2, 10, 0})));
  EXPECT_FALSE(p.receiver.received(make(0xabc, 1, Filled{1, 3, 10, 0})).ok());
}

TEST(WireConversation, BucketsArriveInSegments) {
  Pair p;
  ASSERT_OK(p.start_round(2));
  ASSERT_OK(p.sender_to_receiver(make(0xabc, 1, Filled{0, 0, 100, 0, 0, 0})));
  // Not yet complete: no RELEASE of it, no next bucket, no END.
  EXPECT_FALSE(p.sender.received(make(0xabc, 1, Release{0, 0})).ok());
  EXPECT_NE(p.receiver.received(make(0xabc, 1, Filled{1, 1, 10, 0})).message().find("out of order"),
            std::string::npos);
  // A gap, an overlap, an empty segment that is not the last.
  EXPECT_NE(p.receiver.received(make(0xabc, 1, Filled{0, 0, 300, 0, 200, 0}))
                .message()
                .find("segment [200, 300) of bucket 0 out of order: expected one starting at 100"),
            std::string::npos);
  EXPECT_FALSE(p.receiver.received(make(0xabc, 1, Filled{0, 0, 300, 0, 50, 1})).ok());
  EXPECT_FALSE(p.receiver.received(make(0xabc, 1, Filled{0, 0, 100, 0, 100, 0})).ok());
  ASSERT_OK(p.sender_to_receiver(make(0xabc, 1, Filled{0, 0, 250, 0, 100, 1})));
  ASSERT_OK(p.receiver_to_sender(make(0xabc, 1, Release{0, 0})));
  ASSERT_OK(p.sender_to_receiver(make(0xabc, 1, Filled{1, 1, 10, 0})));
  ASSERT_OK(p.sender_to_receiver(make(0xabc, 1, End{2, 5})));
}

TEST(WireDecoder, RejectsABadSegment) {
  auto bytes = encode(make(7, 3, Filled{0, 0, 10, 0, 20, 1}));
  auto r = decode(bytes, "sender at @x");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("segment starts at 20, after its end 10"), std::string::npos)
      << r.status().message();
  bytes = encode(make(7, 3, Filled{0, 0, 10, 0, 0, 1}));
  bytes.back() = std::byte{2};
  r = decode(bytes, "sender at @x");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("last flag is 2"), std::string::npos) << r.status().message();
}

TEST(WireConversation, StaleAndOutOfOrderMessagesAreRejected) {
  Pair p;
  // Nothing before HELLO / WELCOME.
  EXPECT_FALSE(p.sender.received(make(0xabc, 1, Release{0, 0})).ok());
  EXPECT_FALSE(p.receiver.received(make(0xabc, 1, small_begin())).ok());
  // A HELLO from an old session.
  Status s = p.sender.received(make(0x999, 0, Hello{1, 1}));
  EXPECT_EQ(s.code(), Code::kFailedPrecondition);
  EXPECT_NE(s.message().find("HELLO (session 0000000000000999"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("from receiver 1"), std::string::npos);
  EXPECT_NE(s.message().find("stale session"), std::string::npos);

  ASSERT_OK(p.receiver_to_sender(make(0, 0, Hello{1, 1})));
  ASSERT_OK(p.sender_to_receiver(make(0xabc, 4, Welcome{2, 1024, 1})));
  // BEGIN of a round that already happened.
  Begin b = small_begin();
  b.bucket_count = 2;
  s = p.receiver.received(make(0xabc, 4, b));
  EXPECT_NE(s.message().find("stale round"), std::string::npos) << s.message();
  ASSERT_OK(p.sender_to_receiver(make(0xabc, 5, b)));
  // FILLED skipping a bucket, in the wrong slot, from another round.
  EXPECT_NE(p.receiver.received(make(0xabc, 5, Filled{1, 1, 1, 0})).message().find("out of order"),
            std::string::npos);
  EXPECT_NE(p.receiver.received(make(0xabc, 5, Filled{1, 0, 1, 0})).message().find("slot"),
            std::string::npos);
  EXPECT_NE(p.receiver.received(make(0xabc, 4, Filled{0, 0, 1, 0})).message().find("stale round"),
            std::string::npos);
  EXPECT_NE(p.receiver.received(make(0xabc, 5, Filled{0, 0, 4096, 0})).message().find("exceed"),
            std::string::npos);
  // END before every bucket.
  EXPECT_NE(p.receiver.received(make(0xabc, 5, End{2, 0})).message().find("END after 0 of 2"),
            std::string::npos);
  ASSERT_OK(p.sender_to_receiver(make(0xabc, 5, Filled{0, 0, 1, 0})));
  // RELEASE of a bucket not yet filled, of a stale round, ACK too early.
  EXPECT_FALSE(p.sender.received(make(0xabc, 5, Release{1, 1})).ok());
  EXPECT_NE(p.sender.received(make(0xabc, 4, Release{0, 0})).message().find("stale round"),
            std::string::npos);
  EXPECT_NE(p.sender.received(make(0xabc, 5, Ack{2, 0})).message().find("ACK before"),
            std::string::npos);
  // A message from a different session mid-round.
  EXPECT_EQ(p.sender.received(make(0x1, 5, Release{0, 0})).code(), Code::kFailedPrecondition);
  // Receivers never get RELEASE; senders never get FILLED.
  EXPECT_FALSE(p.receiver.received(make(0xabc, 5, Release{0, 0})).ok());
  EXPECT_FALSE(p.sender.received(make(0xabc, 5, Filled{0, 0, 1, 0})).ok());
}

}  // namespace
}  // namespace ferry::wire
