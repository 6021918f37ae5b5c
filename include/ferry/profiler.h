// ferry's profiler: verl's `tool_config.npu` config, trace sessions and summaries.
//
// The config is verl's (actor_rollout_ref.actor.profiler.tool_config.npu.{contents, level,
// analysis, discrete}) and is read from a verl YAML file, from dotted overrides, or built
// here. Engine code records spans with src/profiler/span.h; a Session turns them into Chrome
// Trace Event JSON files (Perfetto, chrome://tracing) and, with `analysis`, summary tables.
// docs/profiler.md explains each knob and what ferry does with it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/export.h"
#include "ferry/status.h"

namespace ferry::profiler {

// verl's `contents` options.
enum class Content : std::uint8_t {
  kNpu,     // device activity; ferry records device copies under it where its backend has them
  kCpu,     // redundant: stage markers are CPU events and always collected (as in verl)
  kMemory,  // RSS counters at span begin and end
  kShapes,  // tensor shapes and dtypes as span arguments
  kModule,  // the ferry module (sync, checkpoint, ...) as the event category
  kStack,   // the call site (file, line, function) of each span
};

// verl's `level`. ferry keeps stage spans at every level (like verl's mstx markers),
// per-bucket spans from level1 and per-tensor spans at level2.
enum class Level : std::uint8_t { kLevelNone, kLevel0, kLevel1, kLevel2 };

FERRY_EXPORT std::string_view content_name(Content c);  // "npu", ...
FERRY_EXPORT std::string_view level_name(Level l);      // "level_none", "level0", ...
// Accepts the names above; level also takes "0", "1", "2" (as the FAQ writes `level=1`).
// Errors list the allowed values.
FERRY_EXPORT Result<Content> parse_content(std::string_view text);
FERRY_EXPORT Result<Level> parse_level(std::string_view text);

struct FERRY_EXPORT Config {
  // --- verl's tool_config.npu fields, same names and defaults ---
  std::vector<Content> contents;  // default []
  Level level = Level::kLevel0;   // default level0
  // verl's NPUToolConfig dataclass defaults to false while its actor.yaml writes True;
  // ferry follows the dataclass (and the FAQ): a summary costs time at the end of a step,
  // so it is opt-in. A YAML file that says `analysis: True` is honoured as written.
  bool analysis = false;
  bool discrete = false;  // true: one trace per task; false: one trace per step

  // --- verl's profiler section fields ferry also reads ---
  bool enable = false;     // profiler.enable
  bool all_ranks = false;  // profiler.all_ranks
  std::vector<int> ranks;  // profiler.ranks; [] with all_ranks=false means rank 0
  std::string save_path = "outputs/profile";  // profiler.save_path

  // --- ferry's own ---
  // Bytes one trace file may hold; the oldest events are dropped first past it, and the
  // file says how many (verl-project/verl#7669: NPU traces of terabytes).
  std::uint64_t trace_budget_bytes = 256ull << 20;

  bool has(Content c) const;
  // Whether `rank` is profiled under enable/all_ranks/ranks.
  bool profiles_rank(int rank) const;
};

// The config in the spelling verl accepts, one override per field under `prefix`
// (e.g. "actor_rollout_ref.actor.profiler.tool_config.npu"):
//   <prefix>.contents=[npu,cpu]  <prefix>.level=level1  <prefix>.analysis=true  ...
FERRY_EXPORT std::vector<std::string> to_verl_overrides(const Config& config,
                                                        std::string_view prefix);

// Applies one `key=value`. Keys are matched by their dotted suffix, so both
// `actor_rollout_ref.actor.profiler.tool_config.npu.level=1` and `npu.level=1` work, as do
// `...profiler.enable` / `save_path` / `all_ranks` / `ranks` and `ferry.trace_budget_bytes`.
// Returns false (not an error) when the key is not a profiler key, so a caller can pass
// every override of a verl command line. A profiler key with a bad value, or an unknown
// key under `tool_config.npu`, is invalid_argument naming the key and the allowed values.
FERRY_EXPORT Result<bool> apply_override(Config* config, std::string_view text);
FERRY_EXPORT Status apply_overrides(Config* config, const std::vector<std::string>& texts);

// Reads the profiler section from verl YAML text / a file: the first mapping found at
// actor_rollout_ref.actor.profiler, actor.profiler or profiler (or the npu mapping itself
// at the top level). Hydra interpolations (`${oc.select:...}`) are treated as unset.
FERRY_EXPORT Result<Config> config_from_yaml(std::string_view yaml_text,
                                             std::string_view source_name);
FERRY_EXPORT Result<Config> config_from_yaml_file(const std::string& path);

// Who writes a trace; part of every file name.
struct TraceIdentity {
  int rank = 0;
  std::string role = "actor";  // actor, rollout, sender, receiver, ...
};

// One profiling run of a process. Starting it turns spans on (process-wide); destroying
// or stop()ping it turns them off and writes what is pending. One Session at a time.
// Thread-safety: spans may be recorded from any thread; the Session's own methods are
// meant to be called from one controlling thread.
class FERRY_EXPORT Session {
 public:
  // Fails with failed_precondition if another Session is live, io_error if save_path
  // cannot be created.
  static Result<std::unique_ptr<Session>> start(const Config& config, TraceIdentity who);
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  // A step brackets one continuous trace (discrete=false) or numbers the task traces
  // (discrete=true). end_step returns the files written (traces and summaries).
  void begin_step(std::int64_t step);
  Result<std::vector<std::string>> end_step();

  // A task (a sync round, a checkpoint save). With discrete=true each task is its own
  // trace file, written by end_task (events recorded between tasks go to the next task's
  // file); with discrete=false a task is a span in the step's trace and end_task writes
  // nothing.
  void begin_task(std::string_view name);
  Result<std::vector<std::string>> end_task();

  // Writes anything pending and turns spans off. Idempotent.
  Result<std::vector<std::string>> stop();

  const Config& config() const;

  struct Impl;

 private:
  explicit Session(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// --- analysis ---

struct SpanStats {
  std::string name;
  std::uint64_t count = 0;
  double total_us = 0, mean_us = 0, p50_us = 0, p99_us = 0, max_us = 0;
  double share = 0;  // total / the step time of the files it came from (0..1, per rank)
};

struct TraceFileInfo {
  std::string path;
  int rank = -1;
  std::string role;
  std::int64_t step = -1;
  std::string host;
  double extent_us = 0;              // first event start to last event end
  double clock_offset_us = 0;        // this file's monotonic clock minus the first file's
  std::uint64_t dropped_events = 0;  // by the byte budget or a full thread buffer
};

struct Summary {
  std::vector<TraceFileInfo> files;
  std::vector<SpanStats> spans;  // by total time, largest first
  double step_us = 0;            // sum of the files' extents
};

// Summarizes Chrome trace JSON ("X" spans and "b"/"e" ranges); several files are merged
// (per-rank step times summed, clock offsets from each file's wall-clock anchor).
FERRY_EXPORT Result<Summary> summarize_text(std::string_view json_text,
                                            std::string_view source_name);
FERRY_EXPORT Result<Summary> summarize_files(const std::vector<std::string>& paths);

// Writes one Chrome trace holding every event of `paths`, each file shifted onto the first
// file's clock by its wall-clock anchor (same-node files need no shift), so several
// processes' traces of one step open as one timeline.
FERRY_EXPORT Status merge_traces(const std::vector<std::string>& paths,
                                 const std::string& out_path);

FERRY_EXPORT std::string summary_markdown(const Summary& s);
FERRY_EXPORT std::string summary_csv(const Summary& s);
FERRY_EXPORT std::string summary_json(const Summary& s);
// Writes `<prefix>.md` and `<prefix>.csv`, each replaced whole or not at all.
FERRY_EXPORT Status write_summary_files(const Summary& s, const std::string& prefix);

}  // namespace ferry::profiler
