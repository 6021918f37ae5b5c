// verl / Megatron checkpoint folders: scanning, what a node offers for replication (the
// completeness rule), and verify across node folders.
#include "megatron/megatron_dist_checkpoint.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>

#include "ferry/checkpoint.h"
#include "ferry/megatron.h"
#include "megatron/megatron_fixture.h"
#include "support/status_matchers.h"

namespace ferry::checkpoint {
namespace {

using test::dist_path;
using test::VerlSave;
namespace fs = std::filesystem;

bool contains(const std::vector<std::string>& v, const std::string& x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

std::vector<std::string> paths(const ReplicaSet& s) {
  std::vector<std::string> out;
  for (const ReplicaFile& f : s.files) out.push_back(f.path);
  return out;
}

// The problems verify found for one file on one node.
std::vector<std::string> problems_of(const MegatronNodeReport& n, const std::string& file) {
  std::vector<std::string> out;
  for (const MegatronFileProblem& p : n.inconsistent) {
    if (p.file == file) out.push_back(p.message);
  }
  return out;
}

struct TwoNodes {
  testing::TempDir dir;
  std::string n0 = dir.file("node0"), n1 = dir.file("node1");
  std::vector<std::string> roots() const { return {n0, n1}; }
  void copy_metadata(std::int64_t step, const std::string& dist = "") {
    const std::string d = dist.empty() ? dist_path(step) : dist;
    for (const char* f : {"common.pt", ".metadata", "metadata.json"}) {
      fs::copy_file(n0 + "/" + d + "/" + f, n1 + "/" + d + "/" + f,
                    fs::copy_options::overwrite_existing);
    }
    fs::copy_file(n0 + "/latest_checkpointed_iteration.txt",
                  n1 + "/latest_checkpointed_iteration.txt", fs::copy_options::overwrite_existing);
  }
};

TEST(MegatronFolder, ScanFindsStepsTrackerAndTheMetadataOnlyRankZerosNodeHas) {
  TwoNodes t;
  test::write_verl_save(t.roots(), {.step = 3, .roles = {"actor", "critic"}});
  auto n0 = scan_megatron_folder(t.n0);
  ASSERT_OK(n0);
  EXPECT_TRUE(n0->tracker_present);
  ASSERT_TRUE(n0->tracker.has_value());
  EXPECT_EQ(*n0->tracker, 3);
  ASSERT_EQ(n0->steps.size(), 1u);
  const MegatronStep& s = n0->steps[0];
  EXPECT_EQ(s.folder, "global_step_3");
  ASSERT_EQ(s.dist_folders.size(), 2u);  // huggingface/ holds no Megatron file: not one
  EXPECT_EQ(s.dist_folders[0].path, dist_path(3, "actor"));
  EXPECT_EQ(s.dist_folders[1].path, dist_path(3, "critic"));
  EXPECT_EQ(s.dist_folders[0].shards, (std::vector<std::string>{"__0_0.distcp", "__1_0.distcp"}));
  EXPECT_TRUE(s.complete());

  auto n1 = scan_megatron_folder(t.n1);
  ASSERT_OK(n1);
  EXPECT_FALSE(n1->tracker_present);
  ASSERT_EQ(n1->steps.size(), 1u);
  EXPECT_FALSE(n1->steps[0].complete());
  EXPECT_EQ(n1->steps[0].dist_folders[0].shards,
            (std::vector<std::string>{"__2_0.distcp", "__3_0.distcp"}));
  EXPECT_EQ(n1->steps[0].dist_folders[0].missing(),
            (std::vector<std::string>{"common.pt", ".metadata", "metadata.json"}));

  EXPECT_EQ(scan_megatron_folder(t.dir.file("nope")).status().code(), Code::kNotFound);
}

TEST(MegatronFolder, NestedLayoutAndMegatronLmIterFoldersAreFound) {
  testing::TempDir dir;
  const std::string n0 = dir.file("node0");
  // verl's layout v2: actor/{model,optimizer}/dist_ckpt.
  test::write_verl_save({n0},
                        {.step = 4, .dist_subfolders = {"model/dist_ckpt", "optimizer/dist_ckpt"}});
  // Megatron-LM: iter_0000100/ with the same torch_dist files.
  const std::string it = n0 + "/iter_0000100";
  test::put(it + "/common.pt", "PK\x03\x04x");
  test::put(it + "/.metadata", "\x80\x04x");
  test::put(it + "/metadata.json", test::kMegatronConfigJson);
  auto f = scan_megatron_folder(n0);
  ASSERT_OK(f);
  ASSERT_EQ(f->steps.size(), 2u);
  EXPECT_EQ(f->steps[0].dist_folders.size(), 2u);
  EXPECT_EQ(f->steps[0].dist_folders[0].path, "global_step_4/actor/model/dist_ckpt");
  EXPECT_EQ(f->steps[1].step, 100);
  EXPECT_EQ(f->steps[1].dist_folders[0].path, "iter_0000100");
  EXPECT_TRUE(f->steps[1].complete());
}

TEST(MegatronFolder, TrackerAndPathParsing) {
  EXPECT_EQ(*megatron::parse_tracker("5"), 5);
  EXPECT_EQ(*megatron::parse_tracker(" 120\n"), 120);
  EXPECT_NE(megatron::parse_tracker("").status().message().find("empty"), std::string::npos);
  EXPECT_NE(megatron::parse_tracker("release").status().message().find("release"),
            std::string::npos);
  EXPECT_FALSE(megatron::parse_tracker("5a").ok());
  EXPECT_FALSE(megatron::parse_tracker("-1").ok());

  EXPECT_EQ(megatron::parse_megatron_step_folder("global_step_12"), 12);
  EXPECT_EQ(megatron::parse_megatron_step_folder("iter_0000012"), 12);
  EXPECT_FALSE(megatron::parse_megatron_step_folder("global_step_"));
  EXPECT_FALSE(megatron::parse_megatron_step_folder("step_12"));

  EXPECT_TRUE(megatron::is_replica_path("latest_checkpointed_iteration.txt"));
  EXPECT_TRUE(megatron::is_replica_path("global_step_1/actor/dist_ckpt/common.pt"));
  EXPECT_TRUE(megatron::is_replica_path("global_step_1/actor/model/dist_ckpt/.metadata"));
  EXPECT_FALSE(megatron::is_replica_path("global_step_1/actor/dist_ckpt/__0_0.distcp"));
  EXPECT_FALSE(megatron::is_replica_path("other/actor/dist_ckpt/metadata.json"));
  EXPECT_FALSE(megatron::is_replica_path("common.pt"));
  EXPECT_FALSE(megatron::is_replica_path("global_step_1/a/b/c/d/e/f/g/common.pt"));
}

TEST(MegatronFolder, ExpandRootsFindsNodeFoldersAndIgnoresFerrysFormat) {
  TwoNodes t;
  test::write_verl_save(t.roots(), {.step = 1});
  EXPECT_EQ(expand_megatron_roots({t.dir.path()}), t.roots());
  EXPECT_EQ(expand_megatron_roots({t.n1}), std::vector<std::string>{t.n1});
  testing::TempDir ferry_format;
  fs::create_directories(ferry_format.file("node0/step_1"));
  EXPECT_TRUE(expand_megatron_roots({ferry_format.path()}).empty());
}

TEST(MegatronFolder, OffersCompleteStepsUpToTheTrackerAndTheTrackerLast) {
  testing::TempDir dir;
  const std::string n0 = dir.file("node0");
  test::write_verl_save({n0}, {.step = 1});
  test::write_verl_save({n0}, {.step = 2});
  auto set = replica_set(n0);
  ASSERT_OK(set);
  EXPECT_EQ(paths(*set),
            (std::vector<std::string>{dist_path(1) + "/common.pt", dist_path(1) + "/.metadata",
                                      dist_path(1) + "/metadata.json", dist_path(2) + "/common.pt",
                                      dist_path(2) + "/.metadata", dist_path(2) + "/metadata.json",
                                      "latest_checkpointed_iteration.txt"}));
  EXPECT_EQ(set->tracker, 2);
  EXPECT_EQ(set->files[1].bytes, 5000u);
  EXPECT_EQ(set->files[1].xxh3,
            testing::hash_bytes(as_bytes(test::slurp(n0 + "/" + set->files[1].path))));

  // Step 3 being saved: shards, common.pt and .metadata written, no metadata.json, tracker at 2.
  test::write_verl_save({n0}, {.step = 3, .finished = false});
  set = replica_set(n0);
  ASSERT_OK(set);
  EXPECT_EQ(set->files.size(), 7u);
  EXPECT_FALSE(contains(paths(*set), dist_path(3) + "/common.pt"));
  ASSERT_FALSE(set->notes.empty());
  EXPECT_NE(set->notes[0].find("step 3 is newer than the tracker"), std::string::npos)
      << set->notes[0];

  // metadata.json written but the tracker not moved yet: still held back.
  test::put(n0 + "/" + dist_path(3) + "/metadata.json", test::kMegatronConfigJson);
  set = replica_set(n0);
  ASSERT_OK(set);
  EXPECT_EQ(set->files.size(), 7u);

  // The tracker names 3 but a second role's folder is still being written: step 3 and the
  // tracker are held back, steps 1 and 2 still offered.
  test::put(n0 + "/" + dist_path(3, "critic") + "/common.pt", "PK\x03\x04");
  testing::write_bytes(n0 + "/latest_checkpointed_iteration.txt", "3");
  set = replica_set(n0);
  ASSERT_OK(set);
  EXPECT_EQ(set->files.size(), 6u);
  EXPECT_FALSE(set->tracker.has_value());
  EXPECT_FALSE(contains(paths(*set), "latest_checkpointed_iteration.txt"));

  test::put(n0 + "/" + dist_path(3, "critic") + "/.metadata", "\x80\x04");
  test::put(n0 + "/" + dist_path(3, "critic") + "/metadata.json", test::kMegatronConfigJson);
  set = replica_set(n0);
  ASSERT_OK(set);
  EXPECT_EQ(set->files.size(), 13u);
  EXPECT_EQ(set->files.back().path, "latest_checkpointed_iteration.txt");
  EXPECT_EQ(set->tracker, 3);
}

TEST(MegatronFolder, NothingIsOfferedWithoutAReadableTracker) {
  testing::TempDir dir;
  const std::string n0 = dir.file("node0");
  test::write_verl_save({n0}, {.step = 1});
  testing::write_bytes(n0 + "/latest_checkpointed_iteration.txt", "");  // verl's open("w") just ran
  auto set = replica_set(n0);
  ASSERT_OK(set);
  EXPECT_TRUE(set->files.empty());
  ASSERT_EQ(set->notes.size(), 1u);
  EXPECT_NE(set->notes[0].find("empty"), std::string::npos);
  fs::remove(n0 + "/latest_checkpointed_iteration.txt");
  set = replica_set(n0);
  ASSERT_OK(set);
  EXPECT_TRUE(set->files.empty());
}

TEST(MegatronVerify, NamesTheNodeAndEachMetadataFileItLacks) {
  TwoNodes t;
  test::write_verl_save(t.roots(), {.step = 5});
  auto r = verify_megatron(t.roots());
  ASSERT_OK(r);
  EXPECT_FALSE(r->ok());
  EXPECT_EQ(r->tracker, 5);
  EXPECT_EQ(r->steps, std::vector<std::int64_t>{5});
  ASSERT_EQ(r->nodes.size(), 2u);
  EXPECT_TRUE(r->nodes[0].ok());
  EXPECT_EQ(r->nodes[1].node, "node1");
  EXPECT_EQ(r->nodes[1].root, t.n1);
  EXPECT_EQ(
      r->nodes[1].missing,
      (std::vector<std::string>{"latest_checkpointed_iteration.txt", dist_path(5) + "/common.pt",
                                dist_path(5) + "/.metadata", dist_path(5) + "/metadata.json"}));
  EXPECT_TRUE(r->nodes[1].inconsistent.empty());

  t.copy_metadata(5);
  r = verify_megatron(t.roots());
  ASSERT_OK(r);
  EXPECT_TRUE(r->ok()) << (r->nodes[1].missing.empty() ? "" : r->nodes[1].missing[0]);
}

// Issue 15 item 2: a non-rank-0 node's folder verified alone was "tracker absent: OK".
TEST(MegatronVerify, ANonRankZeroNodeVerifiedAloneLacksTheMetadataAndSaysHowToFixIt) {
  TwoNodes t;
  test::write_verl_save(t.roots(), {.step = 5});
  auto r = verify_megatron({t.n0});  // rank 0's node alone: complete
  ASSERT_OK(r);
  EXPECT_TRUE(r->ok());
  EXPECT_TRUE(r->nodes[0].fix.empty());

  r = verify_megatron({t.n1});
  ASSERT_OK(r);
  EXPECT_FALSE(r->ok());
  EXPECT_EQ(r->steps, std::vector<std::int64_t>{5});
  EXPECT_EQ(
      r->nodes[0].missing,
      (std::vector<std::string>{"latest_checkpointed_iteration.txt", dist_path(5) + "/common.pt",
                                dist_path(5) + "/.metadata", dist_path(5) + "/metadata.json"}));
  EXPECT_NE(r->nodes[0].fix.find("--from NODE0:PORT"), std::string::npos) << r->nodes[0].fix;
  ASSERT_FALSE(r->notes.empty());
  EXPECT_NE(r->notes.back().find("rank 0's shards"), std::string::npos) << r->notes.back();

  // A save still running on rank 0's node (its shards there, no metadata.json yet) stays a
  // note, not a failure.
  TwoNodes u;
  test::write_verl_save({u.n0}, {.step = 3, .finished = false});
  r = verify_megatron({u.n0});
  ASSERT_OK(r);
  EXPECT_TRUE(r->ok());
  EXPECT_TRUE(r->steps.empty());

  t.copy_metadata(5);
  r = verify_megatron({t.n1});
  ASSERT_OK(r);
  EXPECT_TRUE(r->ok()) << (r->nodes[0].missing.empty() ? "" : r->nodes[0].missing[0]);
}

TEST(MegatronVerify, ANodeWithoutTheStepFolderLacksAllOfIt) {
  TwoNodes t;
  test::write_verl_save({t.n0}, {.step = 2});
  fs::create_directories(t.n1);
  auto r = verify_megatron(t.roots());
  ASSERT_OK(r);
  EXPECT_EQ(r->nodes[1].missing.size(), 4u);
  EXPECT_TRUE(contains(r->nodes[1].missing, dist_path(2) + "/metadata.json"));
}

TEST(MegatronVerify, CopiesThatDifferFromRankZerosAreInconsistent) {
  TwoNodes t;
  test::write_verl_save(t.roots(), {.step = 1});
  t.copy_metadata(1);
  test::put(t.n1 + "/" + dist_path(1) + "/common.pt", "PK\x03\x04 an older save");
  auto r = verify_megatron(t.roots());
  ASSERT_OK(r);
  EXPECT_FALSE(r->ok());
  EXPECT_TRUE(r->nodes[0].ok());  // node0 holds rank 0's shards: its copy is the reference
  const auto p = problems_of(r->nodes[1], dist_path(1) + "/common.pt");
  ASSERT_EQ(p.size(), 1u);
  EXPECT_NE(p[0].find("differs from the copy on node0"), std::string::npos) << p[0];
  // The same with the roots in the other order: still node1's copy is the odd one.
  r = verify_megatron({t.n1, t.n0});
  ASSERT_OK(r);
  EXPECT_EQ(problems_of(r->nodes[0], dist_path(1) + "/common.pt").size(), 1u);
  EXPECT_TRUE(r->nodes[1].ok());
}

TEST(MegatronVerify, UnreadableMetadataJsonAndEmptyFilesAreInconsistent) {
  TwoNodes t;
  test::write_verl_save(t.roots(), {.step = 1});
  t.copy_metadata(1);
  test::put(t.n1 + "/" + dist_path(1) + "/metadata.json", R"({"sharded_back)");  // torn write
  test::put(t.n1 + "/" + dist_path(1) + "/.metadata", "");
  auto r = verify_megatron(t.roots());
  ASSERT_OK(r);
  auto p = problems_of(r->nodes[1], dist_path(1) + "/metadata.json");
  ASSERT_EQ(p.size(), 1u);
  EXPECT_NE(p[0].find("not valid JSON"), std::string::npos) << p[0];
  p = problems_of(r->nodes[1], dist_path(1) + "/.metadata");
  ASSERT_EQ(p.size(), 1u);
  EXPECT_NE(p[0].find("empty"), std::string::npos);

  test::put(t.n1 + "/" + dist_path(1) + "/metadata.json", R"({"backend": "x"})");
  r = verify_megatron(t.roots());
  ASSERT_OK(r);
  p = problems_of(r->nodes[1], dist_path(1) + "/metadata.json");
  ASSERT_EQ(p.size(), 1u);
  EXPECT_NE(p[0].find("sharded_backend"), std::string::npos) << p[0];
}

TEST(MegatronVerify, TrackerNamingAnIncompleteOrAbsentStepOrLaggingIsInconsistent) {
  TwoNodes t;
  test::write_verl_save(t.roots(), {.step = 1});
  t.copy_metadata(1);
  test::write_verl_save(t.roots(), {.step = 2, .finished = false});
  testing::write_bytes(t.n0 + "/latest_checkpointed_iteration.txt", "2");  // moved too early
  auto r = verify_megatron(t.roots());
  ASSERT_OK(r);
  EXPECT_EQ(r->steps, std::vector<std::int64_t>{1});  // step 2 is complete nowhere
  auto p = problems_of(r->nodes[0], "latest_checkpointed_iteration.txt");
  ASSERT_EQ(p.size(), 1u);
  EXPECT_NE(p[0].find("names step 2, which is incomplete on every node"), std::string::npos)
      << p[0];
  EXPECT_NE(p[0].find("metadata.json"), std::string::npos) << p[0];
  p = problems_of(r->nodes[1], "latest_checkpointed_iteration.txt");
  ASSERT_EQ(p.size(), 1u);
  EXPECT_NE(p[0].find("names step 1, but node0 names step 2"), std::string::npos) << p[0];

  testing::write_bytes(t.n0 + "/latest_checkpointed_iteration.txt", "9");
  r = verify_megatron({t.n0});
  ASSERT_OK(r);
  p = problems_of(r->nodes[0], "latest_checkpointed_iteration.txt");
  ASSERT_EQ(p.size(), 1u);
  EXPECT_NE(p[0].find("names step 9, which has no folder here"), std::string::npos) << p[0];

  testing::write_bytes(t.n0 + "/latest_checkpointed_iteration.txt", "garbage");
  r = verify_megatron({t.n0});
  ASSERT_OK(r);
  EXPECT_EQ(problems_of(r->nodes[0], "latest_checkpointed_iteration.txt").size(), 1u);
}

TEST(MegatronVerify, OneStepOnlyAndAStepNobodyHas) {
  TwoNodes t;
  test::write_verl_save(t.roots(), {.step = 1});
  test::write_verl_save(t.roots(), {.step = 2});
  t.copy_metadata(2);  // step 1's metadata never reached node1
  auto r = verify_megatron(t.roots(), 2);
  ASSERT_OK(r);
  EXPECT_TRUE(r->ok());
  EXPECT_EQ(r->steps, std::vector<std::int64_t>{2});
  r = verify_megatron(t.roots());
  ASSERT_OK(r);
  EXPECT_FALSE(r->ok());
  EXPECT_EQ(r->nodes[1].missing.size(), 3u);
  EXPECT_EQ(verify_megatron(t.roots(), 7).status().code(), Code::kNotFound);
}

}  // namespace
}  // namespace ferry::checkpoint
