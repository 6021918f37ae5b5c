// ferry trace: summaries of profiler traces, and the profiler config in verl's spelling.
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "ferry/profiler.h"

namespace ferry::cli {
namespace {

constexpr const char* kNpuPrefix = "actor_rollout_ref.actor.profiler.tool_config.npu";

struct SummarizeArgs {
  std::vector<std::string> files;
  bool csv = false;
  bool json = false;
  std::string out;  // write <out>.md and <out>.csv too
};

int run_summarize(const SummarizeArgs& a) {
  for (const std::string& f : a.files) {
    std::error_code ec;
    if (!std::filesystem::exists(f, ec)) return usage_error(f + ": no such trace file");
  }
  auto summary = profiler::summarize_files(a.files);
  if (!summary.ok()) return report_error(summary.status());
  if (!a.out.empty()) {
    if (Status s = profiler::write_summary_files(*summary, a.out); !s.ok()) {
      return report_error(s);
    }
  }
  const std::string text = a.json  ? profiler::summary_json(*summary)
                           : a.csv ? profiler::summary_csv(*summary)
                                   : profiler::summary_markdown(*summary);
  std::fputs(text.c_str(), stdout);
  return kExitOk;
}

struct MergeArgs {
  std::vector<std::string> files;
  std::string out;
};

int run_merge(const MergeArgs& a) {
  Status s = profiler::merge_traces(a.files, a.out);
  if (!s.ok()) return report_error(s);
  std::printf("%s\n", a.out.c_str());
  return kExitOk;
}

struct ConfigArgs {
  std::vector<std::string> overrides;
  std::string yaml;
  bool json = false;
};

int run_config(const ConfigArgs& a) {
  profiler::Config config;
  if (!a.yaml.empty()) {
    auto c = profiler::config_from_yaml_file(a.yaml);
    if (!c.ok()) return report_error(c.status());
    config = std::move(*c);
  }
  for (const std::string& o : a.overrides) {
    auto used = profiler::apply_override(&config, o);
    if (!used.ok()) return usage_error(used.status());
    if (!*used) {
      return usage_error("'" + o + "' is not a profiler setting");
    }
  }
  const std::vector<std::string> lines = profiler::to_verl_overrides(config, kNpuPrefix);
  if (a.json) {
    std::string out = "{\"overrides\":[";
    for (std::size_t i = 0; i < lines.size(); ++i) {
      out += (i > 0 ? ",\"" : "\"") + lines[i] + "\"";
    }
    out += "],\"redundant_cpu\":";
    out += config.has(profiler::Content::kCpu) ? "true" : "false";
    std::printf("%s}\n", out.c_str());
    return kExitOk;
  }
  for (const std::string& l : lines) std::printf("%s \\\n", l.c_str());
  std::printf("\n");
  if (config.has(profiler::Content::kCpu)) {
    std::fprintf(stderr,
                 "note: 'cpu' in contents is redundant: stage markers are CPU events and are "
                 "always collected\n");
  }
  return kExitOk;
}

}  // namespace

void add_trace_command(CLI::App& app, Dispatch& dispatch) {
  CLI::App* trace = app.add_subcommand("trace", "Profiler traces: summaries and config");
  trace->require_subcommand(1);
  trace->footer("Example:\n  ferry trace summarize outputs/profile/ferry_trace_rank*_step3.json");

  auto sum = std::make_shared<SummarizeArgs>();
  CLI::App* s = add_command(
      *trace, dispatch, "summarize",
      "Per-span count, total, mean, p50, p99, max and share of the step (Markdown, CSV or "
      "JSON); several files (ranks) are merged and their clock offsets reported",
      "ferry trace summarize --csv prof/ferry_trace_rank0_actor_step3.json "
      "prof/ferry_trace_rank1_actor_step3.json",
      [sum] { return run_summarize(*sum); });
  s->add_option("files", sum->files, "Chrome trace JSON files")
      ->required()
      ->check(CLI::ExistingFile);
  s->add_flag("--csv", sum->csv, "Print CSV instead of Markdown");
  s->add_flag("--json", sum->json, "Print JSON");
  s->add_option("--out", sum->out, "Also write OUT.md and OUT.csv");

  auto merge = std::make_shared<MergeArgs>();
  CLI::App* m = add_command(
      *trace, dispatch, "merge",
      "Merge several processes' traces into one timeline (other nodes' files are shifted by "
      "their wall-clock anchors)",
      "ferry trace merge -o node0_step3.json prof/ferry_trace_rank*_step3.json",
      [merge] { return run_merge(*merge); });
  m->add_option("files", merge->files, "Chrome trace JSON files")
      ->required()
      ->check(CLI::ExistingFile);
  m->add_option("-o,--out", merge->out, "The merged trace to write")->required();

  auto cfg = std::make_shared<ConfigArgs>();
  CLI::App* c = add_command(
      *trace, dispatch, "config",
      "Check profiler settings (a verl YAML and/or overrides, in either spelling) and print "
      "them as the overrides verl accepts",
      "ferry trace config " + std::string(kNpuPrefix) + ".level=1 " + kNpuPrefix +
          ".contents=npu,cpu",
      [cfg] { return run_config(*cfg); });
  c->add_option("overrides", cfg->overrides, "key=value overrides (verl/Hydra style)");
  c->add_option("--yaml", cfg->yaml, "A verl YAML config with a profiler section")
      ->check(CLI::ExistingFile);
  c->add_flag("--json", cfg->json, "Print JSON");
}

}  // namespace ferry::cli
