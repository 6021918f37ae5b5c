// Failures users hit: a rank killed mid-save, a full disk, a damaged shard, a
// node without its manifest, a manifest whose paths try to leave the folder.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>

#include "base/env.h"
#include "base/file_util.h"
#include "checkpoint/format.h"
#include "checkpoint/testing.h"
#include "ckpt_test_util.h"
#include "ferry/checkpoint_tools.h"
#include "support/fault_env.h"
#include "support/status_matchers.h"

namespace ferry::checkpoint {
namespace {

using test::cut_all;
using test::GlobalTensor;
using test::load_and_check;
using test::make_state;
using test::run_group;
using test::save_state;
namespace fs = std::filesystem;

std::vector<std::string> roots_of(const testing::TempDir& dir, int nodes) {
  std::vector<std::string> r;
  for (int i = 0; i < nodes; ++i) r.push_back(dir.path() + "/n" + std::to_string(i));
  return r;
}

// Forks `ranks` processes (nodes n0, n1) saving `step`; rank `victim` SIGKILLs
// itself right after `phase`. Returns each child's wait status.
std::vector<int> save_with_kill(const std::string& dir, const std::vector<GlobalTensor>& state,
                                std::int64_t step, int victim, const std::string& phase) {
  const int ranks = 4;
  const std::string address = test::unique_address();
  std::vector<pid_t> pids;
  for (int r = 0; r < ranks; ++r) {
    pid_t pid = ::fork();
    if (pid == 0) {
      LocalGroupOptions o{address, r, ranks, "n" + std::to_string(r / 2),
                          std::chrono::milliseconds(10'000)};
      auto g = connect_local_group(o);
      if (!g.ok()) ::_exit(10);
      if (r == victim) {
        set_save_phase_hook_for_testing([&](std::string_view p) {
          if (p == phase) ::raise(SIGKILL);
        });
      }
      Checkpointer ckpt(**g, {.root = dir + "/" + o.node});
      auto slices = cut_all(state, r, ranks, 0);
      auto v = test::views(slices);
      Status s = ckpt.save(step, v);
      ::_exit(s.ok() ? 0 : 3);
    }
    pids.push_back(pid);
  }
  std::vector<int> statuses;
  for (pid_t p : pids) {
    int st = 0;
    ::waitpid(p, &st, 0);
    statuses.push_back(st);
  }
  return statuses;
}

class KilledMidSave : public ::testing::TestWithParam<const char*> {};

TEST_P(KilledMidSave, PreviousStepLoadsAndThePartialOneIsListedAndCollected) {
  testing::TempDir dir;
  const auto old_state = make_state(11), new_state = make_state(12);
  save_state(dir.path(), old_state, 4, 2, 1);
  const auto st = save_with_kill(dir.path(), new_state, 2, /*victim=*/2, GetParam());
  ASSERT_TRUE(WIFSIGNALED(st[2]) && WTERMSIG(st[2]) == SIGKILL);
  for (int r : {0, 1, 3}) {  // the survivors fail (EOF from the dead rank), none hangs
    ASSERT_TRUE(WIFEXITED(st[r])) << r;
    EXPECT_EQ(WEXITSTATUS(st[r]), 3) << r;
  }
  const auto roots = roots_of(dir, 2);
  auto listing = list_steps(roots);
  ASSERT_OK(listing);
  ASSERT_EQ(listing->size(), 2u);
  EXPECT_EQ((*listing)[0].state, StepState::kCommitted);
  EXPECT_EQ((*listing)[1].step, 2);
  EXPECT_EQ((*listing)[1].state, StepState::kPartial);
  for (const std::string& root : roots) EXPECT_EQ(format::read_latest(root), 1);

  EXPECT_EQ(load_and_check(dir.path(), old_state, 4, 2, 0).step, 1);

  if (std::string(GetParam()) == "node_marker") {
    // With node markers written, a root alone cannot tell: n1 might hold COMMITTED.
    auto kept = gc({roots[0]});
    ASSERT_OK(kept);
    ASSERT_EQ(kept->size(), 1u);
    EXPECT_FALSE((*kept)[0].removed);
    EXPECT_NE((*kept)[0].reason.find("n1"), std::string::npos) << (*kept)[0].reason;
  }
  auto actions = gc(roots);
  ASSERT_OK(actions);
  int removed = 0;
  for (const GcAction& a : *actions) {
    EXPECT_EQ(a.step, 2);
    removed += a.removed;
  }
  EXPECT_GE(removed, 1);
  for (const std::string& root : roots) {
    EXPECT_FALSE(fs::exists(root + "/step_2")) << root;
    EXPECT_TRUE(fs::exists(root + "/step_1/COMMITTED")) << root;
  }
  EXPECT_EQ(load_and_check(dir.path(), old_state, 4, 2, 0).step, 1);
}

INSTANTIATE_TEST_SUITE_P(Phases, KilledMidSave,
                         ::testing::Values("shards", "manifest", "node_marker"));

TEST(KilledMidSave, AfterCommittedTheNewStepCountsThoughLatestIsOld) {
  testing::TempDir dir;
  const auto old_state = make_state(13), new_state = make_state(14);
  save_state(dir.path(), old_state, 4, 2, 1);
  const auto st = save_with_kill(dir.path(), new_state, 2, 2, "committed");
  ASSERT_TRUE(WIFSIGNALED(st[2]));
  // Every node marker existed before any COMMITTED: the step is complete.
  EXPECT_EQ(format::read_latest(dir.path() + "/n1"), 1);
  EXPECT_EQ(load_and_check(dir.path(), new_state, 4, 2, 0).step, 2);
  auto actions = gc(roots_of(dir, 2));
  ASSERT_OK(actions);
  EXPECT_TRUE(actions->empty());
}

// A disk that fails while step 2 is saved (2 ranks on nodes n0, n1, after step 1 was
// committed): which file's I/O fails, how, and what the error then says.
struct DiskFault {
  const char* name;
  const char* file;  // part of the failing file's path; the error names it
  int error;
  enum { kWrite, kSync, kRename } call;
  Code code;  // of the failing rank's error
};

// Saves `state` as step 2 (two ranks on n0, n1, roots under `dir`) with `env` as the disk;
// every rank's status.
std::map<int, Status> save_step_2(testing::FaultEnv& env, const std::string& dir,
                                  const std::vector<GlobalTensor>& state) {
  std::mutex mu;
  std::map<int, Status> results;
  ScopedEnvOverride full_disk(env);
  run_group(
      2, [](int r) { return "n" + std::to_string(r); },
      [&](RankGroup& g) {
        Checkpointer ckpt(g, {.root = dir + "/" + g.node()});
        auto slices = cut_all(state, g.rank(), g.size(), 0);
        auto v = test::views(slices);
        Status s = ckpt.save(2, v);
        std::lock_guard<std::mutex> lock(mu);
        results[g.rank()] = s;
      });
  return results;
}

class DiskFailsMidSave : public ::testing::TestWithParam<DiskFault> {};

TEST_P(DiskFailsMidSave, ClearErrorNamingTheFileAndThePreviousStepIsIntact) {
  const DiskFault& fault = GetParam();
  testing::TempDir dir;
  const auto old_state = make_state(15), new_state = make_state(21);
  save_state(dir.path(), old_state, 2, 2, 1);

  testing::FaultEnv env;
  switch (fault.call) {
    case DiskFault::kWrite:
      env.fail_writes_from(1, fault.error, fault.file);
      break;
    case DiskFault::kSync:
      env.fail_sync(fault.error, fault.file);
      break;
    case DiskFault::kRename:
      env.fail_rename(fault.error, fault.file);
      break;
  }
  std::map<int, Status> results = save_step_2(env, dir.path(), new_state);
  EXPECT_GE(env.faults(), 1);
  ASSERT_EQ(results.size(), 2u);
  // Rank 0 fails itself; rank 1 alike or, when it reads rank 0's failure first, is told
  // rank 0's error. Either way the message names the file and the system's reason.
  EXPECT_EQ(results[0].code(), fault.code) << results[0].to_string();
  for (const auto& [rank, s] : results) {
    ASSERT_FALSE(s.ok()) << rank;
    EXPECT_NE(s.message().find(fault.file), std::string::npos) << s.to_string();
    EXPECT_NE(s.message().find(std::strerror(fault.error)), std::string::npos) << s.to_string();
  }

  // Step 2 is not complete anywhere; step 1 is still the latest and loads bit-exact.
  const auto roots = roots_of(dir, 2);
  for (const std::string& root : roots) {
    EXPECT_EQ(format::read_latest(root), 1) << root;
    EXPECT_FALSE(fs::exists(root + "/step_2/COMMITTED")) << root;
    // Nothing under its final name but what was fully written and synced.
    for (const auto& e : fs::directory_iterator(root + "/step_2")) {
      EXPECT_EQ(e.path().filename().string().find(".tmp."), std::string::npos) << e.path();
    }
  }
  auto listing = list_steps(roots);
  ASSERT_OK(listing);
  ASSERT_EQ(listing->size(), 2u);
  EXPECT_EQ((*listing)[1].step, 2);
  EXPECT_EQ((*listing)[1].state, StepState::kPartial);
  EXPECT_EQ(load_and_check(dir.path(), old_state, 2, 2, 0).step, 1);
  auto actions = gc(roots);
  ASSERT_OK(actions);
  for (const std::string& root : roots) EXPECT_FALSE(fs::exists(root + "/step_2")) << root;
}

INSTANTIATE_TEST_SUITE_P(
    Faults, DiskFailsMidSave,
    ::testing::Values(DiskFault{"ShardWriteNoSpace", "/step_2/rank_0000", ENOSPC, DiskFault::kWrite,
                                Code::kResourceExhausted},
                      DiskFault{"ShardWriteQuota", "/step_2/rank_0000", EDQUOT, DiskFault::kWrite,
                                Code::kResourceExhausted},
                      DiskFault{"ManifestWriteNoSpace", "/step_2/manifest.json", ENOSPC,
                                DiskFault::kWrite, Code::kResourceExhausted},
                      DiskFault{"ShardFsyncIoError", "/step_2/rank_0000", EIO, DiskFault::kSync,
                                Code::kIoError},
                      DiskFault{"CommittedRenameIoError", "/step_2/COMMITTED", EIO,
                                DiskFault::kRename, Code::kIoError}),
    [](const ::testing::TestParamInfo<DiskFault>& p) { return std::string(p.param.name); });

// Issue 31: a disk that fills after COMMITTED (writing `latest`) made the save report
// ENOSPC for a step that was committed. The error now says it is committed, and it loads.
TEST(DiskFailsAfterCommit, LatestWriteNoSpaceSaysTheStepIsCommittedAndItLoads) {
  testing::TempDir dir;
  const auto old_state = make_state(15), new_state = make_state(21);
  save_state(dir.path(), old_state, 2, 2, 1);
  testing::FaultEnv env;
  env.fail_writes_from(1, ENOSPC, "/latest");
  std::map<int, Status> results = save_step_2(env, dir.path(), new_state);
  ASSERT_GE(env.faults(), 1);
  for (const auto& [rank, s] : results) {
    ASSERT_FALSE(s.ok()) << rank;
    EXPECT_NE(s.message().find("save step 2 is committed on every node"), std::string::npos)
        << s.to_string();
    EXPECT_NE(s.message().find(std::strerror(ENOSPC)), std::string::npos) << s.to_string();
  }
  EXPECT_EQ(load_and_check(dir.path(), new_state, 2, 2, 0).step, 2);
}

// Step 1 from 2 ranks on 2 nodes; returns the manifest entry of `tensor` on rank 1.
SavedSlice saved_slice(const std::string& root, const std::string& tensor, int rank) {
  auto m = format::read_manifest(root, 1);
  EXPECT_OK(m);
  for (const SavedSlice& s : m->find(tensor)->slices)
    if (s.rank == rank) return s;
  ADD_FAILURE() << "no slice";
  return {};
}

// Loads `state` with `ranks` ranks, one per node n0, n1, ...; every rank's status.
std::vector<Status> load_statuses(const std::string& dir, const std::vector<GlobalTensor>& state,
                                  int ranks = 2) {
  std::mutex mu;
  std::vector<Status> out;
  run_group(
      ranks, [](int r) { return "n" + std::to_string(r); },
      [&](RankGroup& g) {
        Checkpointer ckpt(g, {.root = dir + "/" + g.node()});
        auto info = ckpt.prepare_load();
        Status s = info.status();
        if (s.ok()) {
          auto want = cut_all(state, g.rank(), g.size(), 0);
          auto d = test::mutable_views(want);
          s = ckpt.load(d).status();
        }
        std::lock_guard<std::mutex> lock(mu);
        out.push_back(s);
      });
  return out;
}

// Saves `state` as step 1 (two ranks on n0, n1), then inverts one bit of rank 1's slice
// of `tensor` (saved on n1); returns the damaged file.
std::string save_with_flipped_bit(const testing::TempDir& dir,
                                  const std::vector<GlobalTensor>& state,
                                  const std::string& tensor) {
  save_state(dir.path(), state, 2, 2, 1);
  const SavedSlice s = saved_slice(dir.path() + "/n1", tensor, 1);
  const std::string file = dir.path() + "/n1/step_1/" + s.file;
  const auto at = static_cast<std::streamoff>(s.data_offset + 5);
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(at);
  char c = 0;
  f.read(&c, 1);
  c ^= 0x10;
  f.seekp(at);
  f.write(&c, 1);
  return file;
}

// A load error over a damaged shard names its file and the tensor, so the user knows what
// to restore.
::testing::AssertionResult names_file_and_tensor(const Status& st, const std::string& file,
                                                 const std::string& tensor) {
  for (const std::string& part : {file, tensor}) {
    if (st.message().find(part) == std::string::npos) {
      return ::testing::AssertionFailure() << "'" << part << "' not in " << st.to_string();
    }
  }
  return ::testing::AssertionSuccess();
}

TEST(DamagedShard, FlippedByteIsNamedByVerifyAndLoad) {
  testing::TempDir dir;
  const auto state = make_state(16);
  const std::string tensor = "model.layers.0.mlp.down_proj.weight";
  const std::string file = save_with_flipped_bit(dir, state, tensor);
  auto report = verify(roots_of(dir, 2));
  ASSERT_OK(report);
  ASSERT_EQ(report->problems.size(), 1u);
  EXPECT_EQ(report->problems[0].file, file);
  EXPECT_EQ(report->problems[0].tensor, tensor);
  EXPECT_EQ(report->problems[0].node, "n1");
  for (const Status& st : load_statuses(dir.path(), state)) {
    EXPECT_EQ(st.code() == Code::kCorruption || st.code() == Code::kAborted, true)
        << st.to_string();
    EXPECT_TRUE(names_file_and_tensor(st, file, tensor));
  }
}

TEST(DamagedShard, FlippedByteInAFetchedShardIsNamedToTheRanksThatFetchIt) {
  testing::TempDir dir;
  const auto state = make_state(18);
  const std::string tensor = "model.layers.0.mlp.down_proj.weight";
  const std::string file = save_with_flipped_bit(dir, state, tensor);
  // Four ranks on four nodes: n2 and n3 have no shards and fetch n1's from rank 1,
  // whose readahead reads the damaged slice first and must not hide the damage.
  const auto statuses = load_statuses(dir.path(), state, 4);
  ASSERT_EQ(statuses.size(), 4u);
  int fetchers_told = 0;
  for (const Status& st : statuses) {
    ASSERT_FALSE(st.ok());
    EXPECT_TRUE(names_file_and_tensor(st, file, tensor));
    fetchers_told += st.message().find("fetching " + tensor + " from rank 1") != std::string::npos;
  }
  EXPECT_GE(fetchers_told, 1);
}

TEST(MalformedFetch, BadSliceRequestsGetClearErrorsAndTheLoadStillCompletes) {
  testing::TempDir dir;
  const auto state = make_state(19);
  save_state(dir.path(), state, 2, 2, 1);
  std::mutex mu;
  std::vector<Status> loads;
  Status bad_field, bad_region;
  run_group(
      2, [](int r) { return "n" + std::to_string(r); },
      [&](RankGroup& g) {
        Checkpointer ckpt(g, {.root = dir.path() + "/" + g.node()});
        auto info = ckpt.prepare_load();
        ASSERT_OK(info);
        if (g.rank() == 1) {  // rank 0 serves from prepare_load on
          auto field = g.fetch(0, R"({"op":"slice","step":1,"tensor":"odd.rows","slice":"first",)"
                                  R"("offset":[0,0],"extent":[1,5]})");
          // One dimension more than the tensor has: must not be read past the slice's box.
          auto region = g.fetch(0, R"({"op":"slice","step":1,"tensor":"odd.rows","slice":0,)"
                                   R"("offset":[0,0,0],"extent":[1,5,1]})");
          std::lock_guard<std::mutex> lock(mu);
          bad_field = field.status();
          bad_region = region.status();
        }
        auto want = cut_all(state, g.rank(), g.size(), 0);
        auto d = test::mutable_views(want);
        auto stats = ckpt.load(d);
        std::lock_guard<std::mutex> lock(mu);
        loads.push_back(stats.status());
      });
  EXPECT_EQ(bad_field.code(), Code::kCorruption) << bad_field.to_string();
  EXPECT_NE(bad_field.message().find("fetch request from rank 1: 'slice' must be"),
            std::string::npos)
      << bad_field.to_string();
  EXPECT_EQ(bad_region.code(), Code::kCorruption) << bad_region.to_string();
  EXPECT_NE(bad_region.message().find("rank 1 asked for a region outside slice 0 of odd.rows"),
            std::string::npos)
      << bad_region.to_string();
  ASSERT_EQ(loads.size(), 2u);
  for (const Status& st : loads) EXPECT_OK(st);
}

// A rank group whose all_gather number `call` hands this rank `text` as rank
// `victim`'s part: a peer that sends a malformed collective message.
class TamperedGroup : public test::ForwardingGroup {
 public:
  TamperedGroup(RankGroup& inner, int call, int victim, std::string text)
      : ForwardingGroup(inner), call_(call), victim_(victim), text_(std::move(text)) {}
  Result<std::vector<std::string>> all_gather(std::string_view mine) override {
    auto all = inner_.all_gather(mine);
    if (all.ok() && calls_++ == call_) (*all)[victim_] = text_;
    return all;
  }

 private:
  const int call_, victim_;
  const std::string text_;
  int calls_ = 0;
};

TEST(MalformedCollective, FieldsOfTheWrongTypeAreNamedErrorsNotCrashes) {
  testing::TempDir dir;
  const auto state = make_state(20);
  save_state(dir.path(), state, 2, 2, 1);
  struct Case {
    int call;                // which all_gather of the operation
    std::string text, want;  // rank 1's part as rank 0 sees it; rank 0's error
    bool save;
  };
  const Case cases[] = {
      {0, R"({"1":{"committed":"yes","manifest":true}})", "malformed step list from rank 1", false},
      {0, R"({"one":{"committed":true}})", "malformed step list from rank 1", false},
      {1, R"({"code":"zero","files":[],"notes":[]})", "malformed file list from rank 1", false},
      {0, R"({"node":7,"step":2})", "malformed hello from rank 1", true},
      {1, R"({"code":{}})", "malformed status from rank 1", true},  // agree()
      {2,
       R"({"code":0,"file_bytes":8,"tensors":[{"name":"x","dtype":"nonsense","shape":[1],)"
       R"("slices":[]}]})",
       "malformed slice list from rank 1", true},
      {2,
       R"({"code":0,"file_bytes":8,"tensors":[{"name":"x","dtype":"F32","shape":[1],"slices":[)"
       R"({"rank":1,"file":"rank_00001.safetensors","tensor":"x","offset":[0],"extent":[1],)"
       R"("data_offset":0,"bytes":4,"xxh3":"12g"}]}]})",
       "malformed slice list from rank 1: tensor x slice in rank_00001.safetensors: xxh3 '12g'",
       true},
      {2,
       R"({"code":0,"file_bytes":8,"tensors":[{"name":"x","dtype":"F32","shape":[1],"slices":[)"
       R"({"rank":0,"file":"rank_00000.safetensors","tensor":"x","offset":[0],"extent":[1],)"
       R"("data_offset":0,"bytes":4,"xxh3":"0123456789abcdef"}]}]})",
       "malformed slice list from rank 1: tensor x has a slice of rank 0 in rank_00000", true},
      {2, R"({"code":0,"slices":[]})", "malformed slice list from rank 1", true},
  };
  for (const Case& c : cases) {
    Status at_rank0;
    run_group(
        2, [](int r) { return "n" + std::to_string(r); },
        [&](RankGroup& g) {
          TamperedGroup tg(g, g.rank() == 0 ? c.call : -1, 1, c.text);
          Checkpointer ckpt(tg, {.root = dir.path() + "/" + g.node()});
          Status s;
          if (c.save) {
            auto slices = cut_all(state, g.rank(), g.size(), 0);
            auto v = test::views(slices);
            s = ckpt.save(2, v);
          } else {
            s = ckpt.prepare_load().status();
          }
          if (g.rank() == 0) at_rank0 = s;
        });
    EXPECT_EQ(at_rank0.code(), Code::kCorruption) << c.text << ": " << at_rank0.to_string();
    EXPECT_NE(at_rank0.message().find(c.want), std::string::npos) << at_rank0.to_string();
  }
}

TEST(DamagedShard, TruncatedFileIsNamedWithItsTensorsByVerifyAndLoad) {
  testing::TempDir dir;
  const auto state = make_state(17);
  save_state(dir.path(), state, 2, 2, 1);
  const std::string tensor = "odd.rows";  // sorted last in the manifest, laid out last? find it
  const SavedSlice s = saved_slice(dir.path() + "/n1", tensor, 1);
  const std::string file = dir.path() + "/n1/step_1/" + s.file;
  fs::resize_file(file, s.data_offset + 3);
  auto report = verify(roots_of(dir, 2));
  ASSERT_OK(report);
  bool named = false;
  for (const VerifyProblem& p : report->problems) named |= p.file == file && p.tensor == tensor;
  EXPECT_TRUE(named);
  for (const Status& st : load_statuses(dir.path(), state)) {
    EXPECT_FALSE(st.ok());
    EXPECT_NE(st.message().find(s.file), std::string::npos) << st.to_string();
    EXPECT_NE(st.message().find("of tensor "), std::string::npos) << st.to_string();
  }
}

TEST(MissingManifest, LoadFetchesItFromAPeerAndSaysSo) {
  testing::TempDir dir;
  const auto state = make_state(18);
  save_state(dir.path(), state, 2, 2, 1);
  fs::remove(dir.path() + "/n1/step_1/manifest.json");
  auto r = load_and_check(dir.path(), state, 2, 2, 0);
  EXPECT_EQ(r.step, 1);
  ASSERT_EQ(r.notes.size(), 2u);  // each of the two ranks heard it
  for (const std::string& n : r.notes) {
    EXPECT_EQ(n, "node n1 has no manifest for step 1; fetched it from rank 0");
  }
  auto report = verify(roots_of(dir, 2));
  ASSERT_OK(report);
  ASSERT_EQ(report->problems.size(), 1u);
  EXPECT_NE(report->problems[0].message.find("manifest.json is missing"), std::string::npos);
}

TEST(EscapingManifest, PathsLeavingTheCheckpointFolderAreRefused) {
  testing::TempDir dir;
  const auto state = make_state(19);
  save_state(dir.path(), state, 2, 2, 1);
  testing::write_bytes(dir.path() + "/n0/outside.safetensors", "not yours");
  for (const std::string node : {"n0", "n1"}) {
    const std::string path = dir.path() + "/" + node + "/step_1/manifest.json";
    auto text = read_file(path);
    ASSERT_OK(text);
    std::string t = *text;
    for (std::size_t at; (at = t.find("\"rank_00000.safetensors\"")) != std::string::npos;) {
      t.replace(at, 24, "\"../../outside.safetensors\"");
    }
    testing::write_bytes(path, t);
  }
  for (const Status& st : load_statuses(dir.path(), state)) {
    EXPECT_FALSE(st.ok());
    EXPECT_NE(st.message().find("'../../outside.safetensors'"), std::string::npos)
        << st.to_string();
    EXPECT_NE(st.message().find("inside the checkpoint folder"), std::string::npos)
        << st.to_string();
  }
  auto report = verify(roots_of(dir, 2));
  ASSERT_OK(report);
  ASSERT_FALSE(report->problems.empty());
  EXPECT_NE(report->problems[0].message.find("../../outside.safetensors"), std::string::npos);
}

}  // namespace
}  // namespace ferry::checkpoint
