// Issue 31 ("assume a hostile peer"): a rank that fetches a slice checks what arrived
// against the manifest's XXH3 of the whole slice, never trusting the serving rank, and
// so asks for whole slices even when it needs only part of one (a resharded load).
// The hostile peer here is a serving rank whose group flips a byte of what its real
// fetch handler answers: the file on its disk is intact and passed its own check.
#include <gtest/gtest.h>

#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "checkpoint/checkpointer_impl.h"
#include "checkpoint/fetch_request.h"
#include "checkpoint/format.h"
#include "ckpt_test_util.h"
#include "support/status_matchers.h"

namespace ferry::checkpoint {
namespace {

using test::cut_all;
using test::GlobalTensor;
using test::make_state;
using test::OwnedSlice;
using test::run_group;
using test::save_state;

// A slice request as the serving rank saw it, and a hash of what it sent back.
struct Served {
  int from;
  FetchRequest request;
  std::uint64_t sent_xxh3;
};

// A rank group that passes everything through, except that each slice reply of its
// fetch handler goes through `tamper` (which may change the bytes), and every slice
// request is recorded.
class ServingGroup : public test::ForwardingGroup {
 public:
  using Tamper = std::function<void(const FetchRequest&, std::string& bytes)>;
  ServingGroup(RankGroup& inner, Tamper tamper)
      : ForwardingGroup(inner), tamper_(std::move(tamper)) {}
  void set_fetch_handler(FetchHandler handler) override {
    if (!handler) return inner_.set_fetch_handler({});
    inner_.set_fetch_handler([this, handler = std::move(handler)](
                                 int from, std::string_view text) -> Result<FetchReply> {
      auto reply = handler(from, text);
      auto q = decode_fetch_request(text, "rank " + std::to_string(from));
      if (!reply.ok() || !q.ok() || q->op != FetchRequest::Op::kSlice) return reply;
      const auto b = reply->bytes();
      FetchReply out{std::string(reinterpret_cast<const char*>(b.data()), b.size()), {}, nullptr};
      if (tamper_) tamper_(*q, out.owned);
      MutexLock lock(mu_);
      served_.push_back({from, *q, xxh3(out.bytes())});
      return out;
    });
  }

  std::vector<Served> served() {
    MutexLock lock(mu_);
    return served_;
  }

 private:
  const Tamper tamper_;
  Mutex mu_;
  std::vector<Served> served_ FERRY_GUARDED_BY(mu_);
};

// The part `box` of `t`, as a destination filled with zeros (`data` empty) or with the
// expected bytes.
OwnedSlice part(const GlobalTensor& t, const Box& box, bool fill) {
  OwnedSlice s{{t.spec.name, t.spec.dtype, t.spec.shape, box.offset, box.extent}, {}};
  s.data.resize(s.spec.bytes());
  if (fill) {
    const Box whole{std::vector<std::int64_t>(t.spec.shape.size(), 0), t.spec.shape};
    copy_region(box, t.data, whole, s.data, box,
                static_cast<std::size_t>(dtype_bits(t.spec.dtype) / 8));
  }
  return s;
}

const SavedTensor& saved(const Manifest& m, const std::string& name) {
  const SavedTensor* t = m.find(name);
  EXPECT_NE(t, nullptr) << name;
  return *t;
}

// The index of the slice rank `rank` saved of `t`.
std::size_t slice_of_rank(const SavedTensor& t, int rank) {
  for (std::size_t i = 0; i < t.slices.size(); ++i)
    if (t.slices[i].rank == rank) return i;
  ADD_FAILURE() << "no slice of rank " << rank << " in " << t.name;
  return 0;
}

// Loads step 1 of `dir` with `ranks` ranks on node_of(rank), each into cut_all(state, r,
// ranks, dim); rank `hostile`'s served slice replies go through `tamper`. Each rank's
// status and every request rank `hostile` served.
struct HostileLoad {
  std::vector<Status> status;
  std::vector<Served> served;
};
HostileLoad load_with_hostile_rank(const std::string& dir, const std::vector<GlobalTensor>& state,
                                   int ranks, const std::function<std::string(int)>& node_of,
                                   int hostile, const ServingGroup::Tamper& tamper) {
  HostileLoad out;
  out.status.resize(static_cast<std::size_t>(ranks));
  std::mutex mu;
  run_group(ranks, node_of, [&](RankGroup& inner) {
    ServingGroup g(inner, inner.rank() == hostile ? tamper : ServingGroup::Tamper());
    Status s;
    {
      Checkpointer ckpt(g, {.root = dir + "/" + g.node()});
      auto info = ckpt.prepare_load(1);
      s = info.status();
      if (s.ok()) {
        auto got = cut_all(state, g.rank(), g.size(), 0);
        auto d = test::mutable_views(got);
        s = ckpt.load(d).status();
      }
    }
    std::lock_guard<std::mutex> lock(mu);
    out.status[static_cast<std::size_t>(g.rank())] = s;
    if (g.rank() == hostile) out.served = g.served();
  });
  return out;
}

// What a fetching rank must say about a slice that arrived with other bytes than saved.
void expect_names_the_bad_slice(const Status& st, const SavedTensor& t, std::size_t index, int peer,
                                std::uint64_t sent) {
  const SavedSlice& s = t.slices[index];
  EXPECT_EQ(st.code(), Code::kCorruption) << st.to_string();
  const std::string spec = SliceSpec{t.name, t.dtype, t.shape, s.offset, s.extent}.to_string();
  for (const std::string& part :
       {"fetching " + t.name + " from rank " + std::to_string(peer),
        "rank " + std::to_string(peer) + " sent tensor " + t.name + " slice " + spec,
        "XXH3 " + hex(sent), "the manifest's " + hex(s.xxh3)}) {
    EXPECT_NE(st.message().find(part), std::string::npos)
        << "'" << part << "' not in " << st.to_string();
  }
}

const char* const kTensor = "model.layers.0.mlp.down_proj.weight";

TEST(HostilePeer, AWholeSliceServedWithAFlippedByteFailsTheLoadNamingSliceAndPeer) {
  testing::TempDir dir;
  const auto state = make_state(31);
  save_state(dir.path(), state, 4, 2, 1);  // ranks 0, 1 on n0; 2, 3 on n1
  auto manifest = format::read_manifest(dir.path() + "/n0", 1);
  ASSERT_OK(manifest);
  const SavedTensor& t = saved(*manifest, kTensor);
  const std::size_t index = slice_of_rank(t, 2);
  // Four ranks on four nodes, the same boxes: rank 2 (on n2, which has nothing) fetches
  // the whole of slice 2 from rank 1, the only rank on n1, which flips one of its bytes.
  const auto r = load_with_hostile_rank(
      dir.path(), state, 4, [](int rank) { return "n" + std::to_string(rank); }, 1,
      [&](const FetchRequest& q, std::string& bytes) {
        if (q.tensor == kTensor && q.slice == index) bytes[bytes.size() / 2] ^= 0x01;
      });
  std::uint64_t sent = 0;
  int asked = 0;
  for (const Served& s : r.served) {
    if (s.request.tensor != kTensor || s.request.slice != index) continue;
    ++asked;
    EXPECT_EQ(s.from, 2);
    EXPECT_EQ(s.request.region, box_of(t.slices[index]));  // the slice's full box
    sent = s.sent_xxh3;
  }
  ASSERT_EQ(asked, 1);
  ASSERT_NE(sent, t.slices[index].xxh3);
  expect_names_the_bad_slice(r.status[2], t, index, 1, sent);
  for (int rank : {0, 1, 3}) {  // the others hear it from agree()
    const Status& st = r.status[static_cast<std::size_t>(rank)];
    EXPECT_EQ(st.code(), Code::kAborted) << st.to_string();
    EXPECT_NE(st.message().find("rank 2 failed: fetching " + std::string(kTensor)),
              std::string::npos)
        << st.to_string();
  }
}

TEST(HostilePeer, PartOfASliceIsVerifiedAsTheWholeSliceSoAFlipOutsideThePartStillFails) {
  testing::TempDir dir;
  const auto state = make_state(32);
  save_state(dir.path(), state, 4, 2, 1);
  auto manifest = format::read_manifest(dir.path() + "/n0", 1);
  ASSERT_OK(manifest);
  const SavedTensor& t = saved(*manifest, kTensor);
  const std::size_t index = slice_of_rank(t, 2);
  // Eight ranks on four nodes: ranks 4 and 5 (on n2) each need half of slice 2, which
  // rank 2 serves from n1. It flips the slice's last byte: in rank 5's half, outside
  // rank 4's, and rank 4 must refuse the slice all the same.
  const auto r = load_with_hostile_rank(
      dir.path(), state, 8, [](int rank) { return "n" + std::to_string(rank / 2); }, 2,
      [&](const FetchRequest& q, std::string& bytes) {
        if (q.tensor == kTensor && q.slice == index) bytes.back() ^= 0x40;
      });
  std::map<int, std::uint64_t> sent;  // by fetching rank
  for (const Served& s : r.served) {
    if (s.request.tensor != kTensor || s.request.slice != index) continue;
    EXPECT_EQ(s.request.region, box_of(t.slices[index]));  // the whole slice, not the half
    EXPECT_TRUE(sent.emplace(s.from, s.sent_xxh3).second) << "rank " << s.from << " asked twice";
  }
  ASSERT_EQ(sent.size(), 2u);
  for (int rank : {4, 5}) {
    ASSERT_TRUE(sent.count(rank)) << rank;
    expect_names_the_bad_slice(r.status[static_cast<std::size_t>(rank)], t, index, 2, sent[rank]);
  }
  for (int rank : {0, 1, 2, 3, 6, 7}) EXPECT_FALSE(r.status[static_cast<std::size_t>(rank)].ok());
}

TEST(HostilePeer, AnHonestReshardedLoadFetchesEachWholeSliceOnceAndIsBitExact) {
  testing::TempDir dir;
  const auto state = make_state(33);
  save_state(dir.path(), state, 4, 2, 1);  // rows: slices 0, 1 on n0; 2, 3 on n1
  // Three ranks on n0, n1, n2, splitting each tensor by columns (rows for 1-d ones), so
  // every rank needs parts of slices on another node, in boxes not contiguous in them.
  // Rank 2 (on n2, nothing on disk) takes its embedding part as two destinations split
  // inside saved slice 0, so two pieces need parts of that slice.
  const std::string embed = "model.embed_tokens.weight";
  auto destinations = [&](int rank) {
    std::vector<OwnedSlice> want;
    for (const GlobalTensor& t : state) {
      OwnedSlice whole = test::cut(t, rank, 3, 1);
      const Box box{whole.spec.offset, whole.spec.extent};
      if (rank == 2 && t.spec.name == embed) {
        Box a = box, b = box;  // rows [0, 10) and [10, 96); slice 0 is rows [0, 24)
        a.extent[0] = 10;
        b.offset[0] = 10;
        b.extent[0] = box.extent[0] - 10;
        want.push_back(part(t, a, true));
        want.push_back(part(t, b, true));
      } else if (box.volume() > 0) {
        want.push_back(part(t, box, true));
      }
    }
    return want;
  };
  std::mutex mu;
  std::vector<Served> served;
  std::uint64_t local = 0, remote = 0;
  run_group(
      3, [](int rank) { return "n" + std::to_string(rank); },
      [&](RankGroup& inner) {
        ServingGroup g(inner, {});
        {
          Checkpointer ckpt(g, {.root = dir.path() + "/" + g.node()});
          ASSERT_OK(ckpt.prepare_load(1));
          const std::vector<OwnedSlice> want = destinations(g.rank());
          std::vector<OwnedSlice> got = want;
          for (OwnedSlice& o : got) std::fill(o.data.begin(), o.data.end(), std::byte{0});
          auto d = test::mutable_views(got);
          auto stats = ckpt.load(d);
          ASSERT_OK(stats);
          for (std::size_t i = 0; i < want.size(); ++i) {
            EXPECT_EQ(testing::hash_bytes(got[i].data), testing::hash_bytes(want[i].data))
                << want[i].spec.to_string() << " on rank " << g.rank();
          }
          std::lock_guard<std::mutex> lock(mu);
          local += stats->local_bytes;
          remote += stats->remote_bytes;
        }
        std::lock_guard<std::mutex> lock(mu);
        const auto mine = g.served();
        served.insert(served.end(), mine.begin(), mine.end());
      });
  // Every byte of every tensor landed once; remote_bytes counts what landed, not the
  // whole slices fetched to verify.
  EXPECT_EQ(local + remote, test::state_bytes(state));
  EXPECT_GT(remote, 0u);
  auto manifest = format::read_manifest(dir.path() + "/n0", 1);
  ASSERT_OK(manifest);
  std::map<std::tuple<int, std::string, std::size_t>, int> asked;
  for (const Served& s : served) {
    const SavedTensor& t = saved(*manifest, s.request.tensor);
    ASSERT_LT(s.request.slice, t.slices.size());
    EXPECT_EQ(s.request.region, box_of(t.slices[s.request.slice]))
        << s.request.tensor << " slice " << s.request.slice << " from rank " << s.from;
    ++asked[{s.from, s.request.tensor, s.request.slice}];
  }
  for (const auto& [key, n] : asked) {
    EXPECT_EQ(n, 1) << "rank " << std::get<0>(key) << " fetched " << std::get<1>(key) << " slice "
                    << std::get<2>(key) << " " << n << " times";
  }
  const std::size_t slice0 = slice_of_rank(saved(*manifest, embed), 0);
  EXPECT_EQ((asked[{2, embed, slice0}]), 1);
}

}  // namespace
}  // namespace ferry::checkpoint
