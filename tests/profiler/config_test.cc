// Config: verl's names and defaults, both override spellings, YAML, and errors.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "ferry/profiler.h"
#include "support/status_matchers.h"
#include "support/test_support.h"

namespace ferry::profiler {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr const char* kPrefix = "actor_rollout_ref.actor.profiler.tool_config.npu";

std::string key(const std::string& field) { return std::string(kPrefix) + "." + field; }

TEST(ProfilerConfig, DefaultsMatchVerlDataclass) {
  Config c;
  EXPECT_TRUE(c.contents.empty());
  EXPECT_EQ(c.level, Level::kLevel0);
  EXPECT_FALSE(c.analysis);
  EXPECT_FALSE(c.discrete);
}

TEST(ProfilerConfig, FaqOverrideLinesWorkAsWritten) {
  Config c;
  ASSERT_OK(apply_overrides(
      &c, {key("discrete=true"), key("contents=npu,cpu"), key("level=1"), key("analysis=true")}));
  EXPECT_TRUE(c.discrete);
  EXPECT_THAT(c.contents, ElementsAre(Content::kNpu, Content::kCpu));
  EXPECT_EQ(c.level, Level::kLevel1);
  EXPECT_TRUE(c.analysis);
}

TEST(ProfilerConfig, VerlSpellingsWorkToo) {
  Config c;
  ASSERT_OK(apply_overrides(&c, {key("contents=[memory,shapes,stack]"), key("level=level2")}));
  EXPECT_THAT(c.contents, ElementsAre(Content::kMemory, Content::kShapes, Content::kStack));
  EXPECT_EQ(c.level, Level::kLevel2);
  ASSERT_OK(apply_override(&c, key("contents=[]")));
  EXPECT_TRUE(c.contents.empty());
  ASSERT_OK(apply_override(&c, key("level=level_none")));
  EXPECT_EQ(c.level, Level::kLevelNone);
  ASSERT_OK(apply_override(&c, "npu.level=0"));
  EXPECT_EQ(c.level, Level::kLevel0);
}

TEST(ProfilerConfig, PrintsTheSpellingVerlAccepts) {
  Config c;
  ASSERT_OK(apply_overrides(&c, {key("contents=npu,cpu"), key("level=1")}));
  EXPECT_THAT(to_verl_overrides(c, kPrefix),
              ElementsAre(key("contents=[npu,cpu]"), key("level=level1"), key("analysis=false"),
                          key("discrete=false")));
}

TEST(ProfilerConfig, SectionFieldsAndForeignKeys) {
  Config c;
  auto r = apply_override(&c, "actor_rollout_ref.actor.profiler.enable=True");
  ASSERT_OK(r);
  EXPECT_TRUE(*r);
  ASSERT_OK(apply_override(&c, "actor_rollout_ref.actor.profiler.ranks=[0,2]"));
  ASSERT_OK(apply_override(&c, "actor_rollout_ref.actor.profiler.save_path=/tmp/p"));
  EXPECT_TRUE(c.enable);
  EXPECT_THAT(c.ranks, ElementsAre(0, 2));
  EXPECT_EQ(c.save_path, "/tmp/p");
  EXPECT_TRUE(c.profiles_rank(2));
  EXPECT_FALSE(c.profiles_rank(1));
  // Not a profiler key: not ours, not an error.
  auto other = apply_override(&c, "actor_rollout_ref.rollout.name=vllm");
  ASSERT_OK(other);
  EXPECT_FALSE(*other);
  auto torch = apply_override(&c, "actor_rollout_ref.actor.profiler.tool_config.torch.discrete=1");
  ASSERT_OK(torch);
  EXPECT_FALSE(*torch);
}

TEST(ProfilerConfig, BadValuesListAllowedValues) {
  Config c;
  Status s = apply_override(&c, key("level=3")).status();
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr(key("level")));
  EXPECT_THAT(s.message(), HasSubstr("level_none, level0, level1, level2"));

  s = apply_override(&c, key("contents=npu,gpu")).status();
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("'gpu'"));
  EXPECT_THAT(s.message(), HasSubstr("npu, cpu, memory, shapes, module, stack"));

  s = apply_override(&c, key("analysis=maybe")).status();
  EXPECT_THAT(s.message(), HasSubstr("expected true or false"));

  s = apply_override(&c, key("levle=1")).status();
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("unknown profiler key"));
  EXPECT_THAT(s.message(), HasSubstr("contents, level, analysis, discrete"));
}

TEST(ProfilerConfig, ReadsVerlActorYaml) {
  const char* yaml = R"(
actor_rollout_ref:
  actor:
    profiler:
      _target_: verl.utils.profiler.ProfilerConfig
      tool: ${oc.select:global_profiler.tool,null}
      enable: True
      all_ranks: False
      ranks: [1]
      save_path: ${oc.select:global_profiler.save_path,null}
      tool_config:
        nsys:
          discrete: ${oc.select:global_profiler.global_tool_config.nsys.discrete}
        npu:
          _target_: verl.utils.profiler.config.NPUToolConfig
          contents: [npu, memory]
          level: "level1"
          analysis: True
          discrete: False
)";
  auto c = config_from_yaml(yaml, "actor.yaml");
  ASSERT_OK(c);
  EXPECT_TRUE(c->enable);
  EXPECT_THAT(c->ranks, ElementsAre(1));
  EXPECT_EQ(c->save_path, "outputs/profile");  // interpolation: unset
  EXPECT_THAT(c->contents, ElementsAre(Content::kNpu, Content::kMemory));
  EXPECT_EQ(c->level, Level::kLevel1);
  EXPECT_TRUE(c->analysis);  // the YAML's True is honoured as written
  EXPECT_FALSE(c->discrete);
}

TEST(ProfilerConfig, YamlErrorsNameFileAndKey) {
  auto c = config_from_yaml("profiler:\n  tool_config:\n    npu:\n      level: level9\n", "x.yaml");
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(c.status().message(), HasSubstr("x.yaml: profiler.tool_config.npu.level"));
  EXPECT_THAT(c.status().message(), HasSubstr("level_none"));

  c = config_from_yaml("profiler:\n  tool_config:\n    npu:\n      colour: red\n", "x.yaml");
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(c.status().message(), HasSubstr("unknown profiler key"));

  c = config_from_yaml("profiler: [unclosed\n", "bad.yaml");
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(c.status().message(), HasSubstr("bad.yaml"));

  testing::TempDir dir;
  auto missing = config_from_yaml_file(dir.file("none.yaml"));
  ASSERT_FALSE(missing.ok());
  EXPECT_THAT(missing.status().message(), HasSubstr("none.yaml"));
}

}  // namespace
}  // namespace ferry::profiler
