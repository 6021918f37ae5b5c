// Writes the seed corpus of wire_conversation_fuzz: legitimate message sequences (and a
// few a Conversation must refuse) from the point where the fuzzer's session stands, in
// round 1. Usage: wire_conversation_seeds DIR
#include <cstdio>
#include <string>
#include <vector>

#include "../wire_conversation_script.h"

namespace w = ferry::wire;
namespace f = ferry::wire::fuzz;

namespace {

using Seq = std::vector<std::byte>;

w::Message filled(std::uint64_t round, std::uint32_t bucket, std::uint64_t offset,
                  std::uint64_t end, bool last) {
  return {f::kSession, round,
          w::Filled{bucket % f::kSlots, bucket, end, 0, offset,
                    static_cast<std::uint8_t>(last ? 1 : 0)}};
}
w::Message release(std::uint64_t round, std::uint32_t bucket) {
  return {f::kSession, round, w::Release{bucket % f::kSlots, bucket}};
}

// Every bucket of `round` whole, each released, END and ACK.
void whole_round(Seq* s, std::uint64_t round, std::uint32_t buckets) {
  for (std::uint32_t b = 0; b < buckets; ++b) {
    f::append_record(s, f::kToReceiver, filled(round, b, 0, f::kBucketBytes, true));
    f::append_record(s, f::kToSender, release(round, b));
  }
  f::append_record(s, f::kToReceiver, {f::kSession, round, w::End{buckets, 0}});
  f::append_record(s, f::kToSender, {f::kSession, round, w::Ack{buckets, 0}});
}

bool write(const std::string& dir, const std::string& name, const Seq& s) {
  const std::string path = dir + "/" + name;
  std::FILE* out = std::fopen(path.c_str(), "wb");
  if (out == nullptr) return false;
  const bool ok = std::fwrite(s.data(), 1, s.size(), out) == s.size();
  return std::fclose(out) == 0 && ok;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s DIR\n", argv[0]);
    return 2;
  }
  const std::string dir = argv[1];
  bool ok = true;

  Seq one;
  whole_round(&one, 1, f::kBuckets);
  ok &= write(dir, "one_round", one);

  Seq two = one;  // then round 2, of one bucket sent in three segments
  f::append_record(&two, f::kToReceiver, f::begin(2, 1));
  f::append_record(&two, f::kToReceiver, filled(2, 0, 0, 100, false));
  f::append_record(&two, f::kToReceiver, filled(2, 0, 100, 700, false));
  f::append_record(&two, f::kToReceiver, filled(2, 0, 700, f::kBucketBytes, true));
  f::append_record(&two, f::kToSender, release(2, 0));
  f::append_record(&two, f::kToReceiver, {f::kSession, 2, w::End{1, 0}});
  f::append_record(&two, f::kToSender, {f::kSession, 2, w::Ack{1, 0}});
  ok &= write(dir, "two_rounds_segments", two);

  Seq delta = one;  // then round 2 as a delta round: one blob decoding into a bf16 tensor
  w::Begin db = std::get<w::Begin>(f::begin(2, 1).body);
  db.manifest.push_back(*ferry::TensorSpec::make("w", ferry::DType::kU8, {100}));
  db.total_bytes = 100;
  db.keep_copies = 1;
  db.codec = 1;
  db.base_version = 1;
  db.version = 2;
  db.targets.push_back({*ferry::TensorSpec::make("w", ferry::DType::kBF16, {8, 4}), 42});
  f::append_record(&delta, f::kToReceiver, {f::kSession, 2, db});
  f::append_record(&delta, f::kToReceiver, filled(2, 0, 0, 100, true));
  f::append_record(&delta, f::kToSender, release(2, 0));
  f::append_record(&delta, f::kToReceiver, {f::kSession, 2, w::End{1, 0}});
  f::append_record(&delta, f::kToSender, {f::kSession, 2, w::Ack{1, 0}});
  ok &= write(dir, "delta_round", delta);

  Seq pipelined;  // both slots filled before the first release
  f::append_record(&pipelined, f::kToReceiver, filled(1, 0, 0, f::kBucketBytes, true));
  f::append_record(&pipelined, f::kToReceiver, filled(1, 1, 0, f::kBucketBytes, true));
  f::append_record(&pipelined, f::kToSender, release(1, 0));
  f::append_record(&pipelined, f::kToReceiver, filled(1, 2, 0, 10, true));
  f::append_record(&pipelined, f::kToSender, release(1, 1));
  f::append_record(&pipelined, f::kToSender, release(1, 2));
  f::append_record(&pipelined, f::kToReceiver, {f::kSession, 1, w::End{3, 0}});
  f::append_record(&pipelined, f::kToSender, {f::kSession, 1, w::Ack{3, 0}});
  ok &= write(dir, "pipelined", pipelined);

  Seq errors;  // each side gives up mid-round
  f::append_record(&errors, f::kToReceiver, filled(1, 0, 0, 5, false));
  f::append_record(&errors, f::kToSender, {f::kSession, 1, w::Error{ferry::Code::kAborted, "bye"}});
  f::append_record(&errors, f::kToReceiver, {f::kSession, 1, w::Error{ferry::Code::kTimeout, "x"}});
  ok &= write(dir, "errors", errors);

  Seq refused;  // what each side must refuse: early END, early ACK, a release not filled
  f::append_record(&refused, f::kToReceiver, {f::kSession, 1, w::End{3, 0}});
  f::append_record(&refused, f::kToSender, {f::kSession, 1, w::Ack{3, 0}});
  f::append_record(&refused, f::kToSender, release(1, 0));
  f::append_record(&refused, f::kToReceiver, filled(1, 1, 0, f::kBucketBytes, true));
  f::append_record(&refused, f::kToReceiver, f::begin(2, 1));
  f::append_record(&refused, f::kToSender, f::hello());
  f::append_record(&refused, f::kToReceiver, f::welcome());
  ok &= write(dir, "refused", refused);

  if (!ok) {
    std::perror(dir.c_str());
    return 1;
  }
  return 0;
}
