// ckpt_bench: checkpoint save/load against the disk's own sequential bandwidth D,
// measured in the same run (docs/benchmarks.md, "Checkpoints").
//
//   ckpt_bench [--dir DIR] [--preset qwen2.5-1.5b] [--layers N] [--disk-mb 2048]
//              [--load-rounds 5] [--skip-async 0|1]
//
// Loads run in rounds: the shard files read cold with plain reads (the disk's read
// bandwidth for these files, right now), the same-layout load, then each resharded
// case. Each case reports its median over the rounds; ratios are medians of per-round
// ratios, steadier on a shared machine (whose disk speed drifts 2x within a minute)
// than a ratio of medians. "cpu" is the process's user + system seconds, "disk busy"
// the share of the load's time the disk had reads in flight.
//
// Page cache: every timed read first drops the file's pages with
// posix_fadvise(DONTNEED) after an fsync, so reads come from the disk, not memory
// (drop_caches needs privileges this avoids; pages of other processes are untouched).
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "ferry/checkpoint.h"
#include "ferry/model.h"

namespace ck = ferry::checkpoint;
using Clock = std::chrono::steady_clock;
namespace fs = std::filesystem;

namespace {

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "ckpt_bench: %s\n", what.c_str());
  std::exit(1);
}

void drop_cache(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return;
  ::fdatasync(fd);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

void drop_tree(const std::string& dir) {
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.is_regular_file()) drop_cache(e.path().string());
}

// D: `streams` files written at once, `bytes` in all, in 16 MiB writes then fsync;
// read back cold in 16 MiB reads, also at once.
std::pair<double, double> disk_bandwidth(const std::string& dir, std::uint64_t bytes, int streams);

// One stream: phase 0 writes + fsyncs `bytes`, phase 1 reads them back cold.
void disk_stream(const std::string& path, std::uint64_t bytes, int phase) {
  std::vector<char> buf(16 << 20);
  if (phase == 0) {
    std::mt19937_64 rng(std::hash<std::string>{}(path));
    for (std::size_t i = 0; i < buf.size(); i += 8) {
      const std::uint64_t v = rng();
      std::memcpy(buf.data() + i, &v, 8);
    }
    int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) die("open " + path + ": " + std::strerror(errno));
    for (std::uint64_t done = 0; done < bytes; done += buf.size()) {
      if (::write(fd, buf.data(), buf.size()) != static_cast<ssize_t>(buf.size()))
        die("write failed");
    }
    ::fsync(fd);
    ::close(fd);
    return;
  }
  int fd = ::open(path.c_str(), O_RDONLY);
  while (::read(fd, buf.data(), buf.size()) > 0) {
  }
  ::close(fd);
}

std::pair<double, double> disk_bandwidth(const std::string& dir, std::uint64_t bytes, int streams) {
  double secs[2];
  for (int phase = 0; phase < 2; ++phase) {
    if (phase == 1)
      for (int i = 0; i < streams; ++i) drop_cache(dir + "/disk_probe." + std::to_string(i));
    std::vector<std::thread> t;
    auto t0 = Clock::now();
    for (int i = 0; i < streams; ++i) {
      t.emplace_back([&, i] {
        disk_stream(dir + "/disk_probe." + std::to_string(i), bytes / streams, phase);
      });
    }
    for (auto& x : t) x.join();
    secs[phase] = seconds_since(t0);
  }
  for (int i = 0; i < streams; ++i) fs::remove(dir + "/disk_probe." + std::to_string(i));
  return {bytes / secs[0], bytes / secs[1]};
}

double cpu_seconds() {
  struct rusage ru {};
  ::getrusage(RUSAGE_SELF, &ru);
  auto sec = [](timeval t) { return static_cast<double>(t.tv_sec) + t.tv_usec / 1e6; };
  return sec(ru.ru_utime) + sec(ru.ru_stime);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

// Milliseconds the block device holding `dir` has had requests in flight
// (io_ticks, the 10th field of /sys/dev/block/MAJ:MIN/stat); -1 where unknown.
double disk_busy_ms(const std::string& dir) {
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) return -1;
  const std::string path = "/sys/dev/block/" + std::to_string(major(st.st_dev)) + ":" +
                           std::to_string(minor(st.st_dev)) + "/stat";
  FILE* f = std::fopen(path.c_str(), "r");
  if (f == nullptr) return -1;
  unsigned long long v[10] = {};
  int got = 0;
  while (got < 10 && std::fscanf(f, "%llu", &v[got]) == 1) ++got;
  std::fclose(f);
  return got == 10 ? static_cast<double>(v[9]) : -1;
}

struct LoadRun {
  double seconds;
  double cpu_seconds;
  double disk_busy;  // fraction of `seconds` the disk had reads in flight; < 0 unknown
  std::uint64_t remote_bytes;
};

double median_of(const std::vector<LoadRun>& runs, double LoadRun::*field) {
  std::vector<double> v;
  for (const LoadRun& r : runs) v.push_back(r.*field);
  return median(v);
}

struct Tensor {
  ferry::TensorSpec spec;
  std::vector<std::byte> data;
};

// Runs fn(group) on `ranks` threads, rank r on node n<r * nodes / ranks>; returns wall seconds.
double run_ranks(int ranks, int nodes, const std::function<void(ck::RankGroup&)>& fn) {
  std::random_device rd;
  const std::string address = "@ferry-ckpt-bench-" + std::to_string(rd());
  std::vector<std::thread> threads;
  auto t0 = Clock::now();
  for (int r = 0; r < ranks; ++r) {
    threads.emplace_back([&, r] {
      ck::LocalGroupOptions o;
      o.root_address = address;
      o.rank = r;
      o.size = ranks;
      o.node = "n" + std::to_string(r * nodes / ranks);
      auto g = ck::connect_local_group(o);
      if (!g.ok()) die(g.status().to_string());
      fn(**g);
    });
  }
  for (auto& t : threads) t.join();
  return seconds_since(t0);
}

std::vector<ck::SliceView> my_slices(const std::vector<Tensor>& state, int rank, int size) {
  std::vector<ck::SliceView> out;
  for (const Tensor& t : state) {
    const std::int64_t rows = t.spec.shape[0];
    const std::int64_t b = rows * rank / size, e = rows * (rank + 1) / size;
    if (e == b) continue;
    const std::size_t row = t.data.size() / static_cast<std::size_t>(rows);
    out.push_back({ck::SliceSpec::along(t.spec.name, t.spec.dtype, t.spec.shape, 0, b, e - b),
                   {t.data.data() + b * row, static_cast<std::size_t>(e - b) * row}});
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir = std::getenv("TMPDIR") ? std::getenv("TMPDIR") : "/tmp";
  std::string preset = "qwen2.5-1.5b";
  std::int64_t layers = -1;
  std::uint64_t disk_mb = 2048;
  int load_rounds = 5;
  bool skip_async = false;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--dir")
      dir = v;
    else if (k == "--preset")
      preset = v;
    else if (k == "--layers")
      layers = std::stoll(v);
    else if (k == "--disk-mb")
      disk_mb = std::stoull(v);
    else if (k == "--load-rounds")
      load_rounds = std::max(1, std::stoi(v));
    else if (k == "--skip-async")
      skip_async = v == "1";
    else
      die("unknown option " + k);
  }
  dir += "/ckpt_bench." + std::to_string(::getpid());
  fs::create_directories(dir);

  auto [dw1, dr1] = disk_bandwidth(dir, disk_mb << 20, 1);
  auto [dw4, dr4] = disk_bandwidth(dir, disk_mb << 20, 4);
  // D is the better of one stream and four (the save writes 4 files at once).
  const double dw = std::max(dw1, dw4), dr = std::max(dr1, dr4);
  std::printf(
      "disk D, %llu MB: write (fsync included) %.0f MB/s 1 stream, %.0f MB/s 4 streams; "
      "read (cold) %.0f MB/s 1 stream, %.0f MB/s 4 streams\n",
      static_cast<unsigned long long>(disk_mb), dw1 / 1e6, dw4 / 1e6, dr1 / 1e6, dr4 / 1e6);

  auto config = ferry::model::preset(preset);
  if (!config.ok()) die(config.status().to_string());
  if (layers > 0) config->num_layers = std::min(config->num_layers, layers);
  std::vector<Tensor> state;
  std::uint64_t total = 0;
  for (const auto& spec : ferry::model::hf_tensor_specs(*config, ferry::DType::kBF16)) {
    Tensor t{spec, std::vector<std::byte>(spec.bytes())};
    ferry::model::fill_synthetic(3, spec.name, 0, t.data);
    total += t.data.size();
    state.push_back(std::move(t));
  }
  std::printf("state: %s, %lld layers, bf16, %zu tensors, %.2f GB\n", config->name.c_str(),
              static_cast<long long>(config->num_layers), state.size(), total / 1e9);

  // memcpy of the state into warm memory: the floor for an async save's blocking time.
  std::vector<std::byte> copy(total);
  std::memset(copy.data(), 1, copy.size());
  auto t0 = Clock::now();
  std::uint64_t at = 0;
  for (const Tensor& t : state) {
    std::memcpy(copy.data() + at, t.data.data(), t.data.size());
    at += t.data.size();
  }
  const double memcpy_s = seconds_since(t0);
  std::vector<std::byte>().swap(copy);

  const int ranks = 4, nodes = 2;
  const double save_s = run_ranks(ranks, nodes, [&](ck::RankGroup& g) {
    ck::Checkpointer c(g, {.root = dir + "/" + g.node()});
    auto v = my_slices(state, g.rank(), g.size());
    if (ferry::Status s = c.save(skip_async ? 3 : 1, v); !s.ok()) die(s.to_string());
  });

  // Async: the blocking part (staging copy) of the first save (cold staging)
  // and of a second one (warm staging), then the time until both are durable.
  std::vector<double> block1(ranks), block2(ranks), block0(ranks);
  if (!skip_async)
    run_ranks(ranks, nodes, [&](ck::RankGroup& g) {  // first save_async, staging reserved up front
      auto v = my_slices(state, g.rank(), g.size());
      std::uint64_t mine = 0;
      for (const auto& x : v) mine += x.data.size();
      ck::Checkpointer c(g, {.root = dir + "/" + g.node(), .staging_bytes = mine});
      if (!g.barrier().ok()) die("barrier");  // every rank's staging is ready: time the copy alone
      auto b0 = Clock::now();
      if (ferry::Status s = c.save_async(2, v); !s.ok()) die(s.to_string());
      block0[g.rank()] = seconds_since(b0);
      if (ferry::Status s = c.wait(); !s.ok()) die(s.to_string());
    });
  const double async_total = skip_async ? 0 : run_ranks(ranks, nodes, [&](ck::RankGroup& g) {
    ck::Checkpointer c(g, {.root = dir + "/" + g.node()});
    auto v = my_slices(state, g.rank(), g.size());
    if (!g.barrier().ok()) die("barrier");
    auto b0 = Clock::now();
    if (ferry::Status s = c.save_async(3, v); !s.ok()) die(s.to_string());
    block1[g.rank()] = seconds_since(b0);
    if (ferry::Status s = c.wait(); !s.ok()) die(s.to_string());
    if (!g.barrier().ok()) die("barrier");
    b0 = Clock::now();
    if (ferry::Status s = c.save_async(4, v); !s.ok()) die(s.to_string());
    block2[g.rank()] = seconds_since(b0);
    if (ferry::Status s = c.wait(); !s.ok()) die(s.to_string());
  });
  const double blk1 = *std::max_element(block1.begin(), block1.end());
  const double blk2 = *std::max_element(block2.begin(), block2.end());
  const double blk0 = *std::max_element(block0.begin(), block0.end());
  state.clear();
  state.shrink_to_fit();

  // Loads of step 3 into one reused destination buffer, cold from disk.
  std::vector<std::byte> dest(total);
  std::memset(dest.data(), 0, dest.size());
  auto specs = ferry::model::hf_tensor_specs(*config, ferry::DType::kBF16);
  auto load = [&](int lr, int ln, int dim, bool cold = true) {
    if (cold) drop_tree(dir);
    const double cpu0 = cpu_seconds(), busy0 = disk_busy_ms(dir);
    std::vector<std::uint64_t> remote(lr);
    const double s = run_ranks(lr, ln, [&](ck::RankGroup& g) {
      ck::Checkpointer c(g, {.root = dir + "/" + g.node()});
      auto info = c.prepare_load();
      if (!info.ok()) die(info.status().to_string());
      // Each rank's slices are packed into its own share of `dest`.
      std::vector<ck::MutableSliceView> d;
      std::uint64_t off = 0;
      for (int r = 0; r < g.size(); ++r) {
        for (const auto& t : specs) {
          const int dd = t.shape.size() > static_cast<std::size_t>(dim) ? dim : 0;
          const std::int64_t n = t.shape[dd];
          const std::int64_t b = n * r / g.size(), e = n * (r + 1) / g.size();
          auto spec = ck::SliceSpec::along(t.name, t.dtype, t.shape, dd, b, e - b);
          if (e > b && r == g.rank()) d.push_back({spec, {dest.data() + off, spec.bytes()}});
          off += e > b ? spec.bytes() : 0;
        }
      }
      auto st = c.load(d);
      if (!st.ok()) die(st.status().to_string());
      remote[g.rank()] = st->remote_bytes;
    });
    const double busy1 = disk_busy_ms(dir);
    LoadRun run{s, cpu_seconds() - cpu0, busy0 < 0 || busy1 < 0 ? -1 : (busy1 - busy0) / 1e3 / s,
                0};
    for (auto b : remote) run.remote_bytes += b;
    return run;
  };
  // The shard files of step 3 read cold with plain 16 MiB reads, all at once: the
  // disk's read bandwidth for these very files, next to the loads it limits.
  std::vector<std::string> shards;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    const std::string path = e.path().string();
    if (e.is_regular_file() && path.find("/step_3/") != std::string::npos &&
        e.path().extension() == ".safetensors")
      shards.push_back(path);
  }
  auto read_shards = [&] {
    for (const std::string& f : shards) drop_cache(f);
    std::vector<std::thread> t;
    const auto start = Clock::now();
    for (const std::string& f : shards) t.emplace_back([&f] { disk_stream(f, 0, 1); });
    for (auto& x : t) x.join();
    return seconds_since(start);
  };
  std::vector<double> shard_read;  // seconds, one per round
  std::vector<LoadRun> same, re, re1;
  for (int i = 0; i < load_rounds; ++i) {
    shard_read.push_back(read_shards());
    same.push_back(load(4, 2, 0));
    re.push_back(load(8, 4, 0));
    re1.push_back(load(2, 2, 1));
    std::printf(
        "load round %d: read the shards %.2f s; same layout %.2f s, resharded 8/4 %.2f s, "
        "2/2 dim 1 %.2f s; disk busy %.0f%%, %.0f%%, %.0f%%\n",
        i + 1, shard_read.back(), same.back().seconds, re.back().seconds, re1.back().seconds,
        100 * same.back().disk_busy, 100 * re.back().disk_busy, 100 * re1.back().disk_busy);
  }
  // Once more with the shards in the page cache: no disk, so what is left is CPU work
  // (hashing, copying, and for the resharded load moving bytes through the sockets).
  const LoadRun warm_same = load(4, 2, 0, false), warm_re = load(8, 4, 0, false);
  const double same_s = median_of(same, &LoadRun::seconds);
  auto ratio = [&](const std::vector<LoadRun>& v) {  // to the same-layout load of the same round
    std::vector<double> q;
    for (std::size_t i = 0; i < v.size(); ++i) q.push_back(v[i].seconds / same[i].seconds);
    return median(q);
  };

  const double gb = total / 1e9;
  std::printf("\n%-44s %9s %10s %s\n", "case", "seconds", "GB/s", "ratio");
  std::printf("%-44s %9.2f %10.2f %.2f of D write (target >= 0.8)\n", "save, 4 ranks / 2 nodes",
              save_s, gb / save_s, total / save_s / dw);
  std::printf("%-44s %9.2f %10s\n", "memcpy of the state (1 thread, warm)", memcpy_s, "");
  if (!skip_async) {
    std::printf("%-44s %9.2f %10s %.2f x memcpy (target <= 1.3)\n",
                "async save blocking, first, no staging_bytes", blk1, "", blk1 / memcpy_s);
    std::printf("%-44s %9.2f %10s %.2f x memcpy (target <= 1.3)\n",
                "async save blocking, first, staging_bytes set", blk0, "", blk0 / memcpy_s);
    std::printf("%-44s %9.2f %10s %.2f x memcpy (target <= 1.3)\n",
                "async save blocking, second (warm)", blk2, "", blk2 / memcpy_s);
    std::printf("%-44s %9.2f %10.2f\n", "two async saves until durable", async_total,
                2 * gb / async_total);
  }
  auto cpu = [](const std::vector<LoadRun>& v) { return median_of(v, &LoadRun::cpu_seconds); };
  auto busy = [](const std::vector<LoadRun>& v) { return 100 * median_of(v, &LoadRun::disk_busy); };
  std::vector<double> of_read;  // same-layout load against reading its shards, per round
  for (std::size_t i = 0; i < same.size(); ++i) of_read.push_back(shard_read[i] / same[i].seconds);
  std::printf("%-44s %9.2f %10.2f\n", "read the shard files (4 streams, cold)", median(shard_read),
              gb / median(shard_read));
  std::printf(
      "%-44s %9.2f %10.2f %.2f of reading the shards (target >= 0.8), %.2f of D read; "
      "cpu %.2f s; disk busy %.0f%%\n",
      "load, same layout 4 ranks / 2 nodes", same_s, gb / same_s, median(of_read),
      total / same_s / dr, cpu(same), busy(same));
  const double re_s = median_of(re, &LoadRun::seconds);
  std::printf(
      "%-44s %9.2f %10.2f %.2f x same layout (target <= 1.3); %.2f GB fetched; cpu %.2f s; "
      "disk busy %.0f%%\n",
      "load, resharded to 8 ranks / 4 nodes", re_s, gb / re_s, ratio(re), re[0].remote_bytes / 1e9,
      cpu(re), busy(re));
  const double re1_s = median_of(re1, &LoadRun::seconds);
  std::printf(
      "%-44s %9.2f %10.2f %.2f x same layout; %.2f GB fetched; cpu %.2f s; disk busy %.0f%%\n",
      "load, resharded to 2 ranks / 2 nodes, dim 1", re1_s, gb / re1_s, ratio(re1),
      re1[0].remote_bytes / 1e9, cpu(re1), busy(re1));
  std::printf("%-44s %9.2f %10.2f cpu %.2f s\n", "load, same layout, page cache warm",
              warm_same.seconds, gb / warm_same.seconds, warm_same.cpu_seconds);
  std::printf("%-44s %9.2f %10.2f %.2f x warm same layout; cpu %.2f s\n",
              "load, resharded 8 ranks / 4 nodes, warm", warm_re.seconds, gb / warm_re.seconds,
              warm_re.seconds / warm_same.seconds, warm_re.cpu_seconds);
  std::printf("(cold loads: medians of %d rounds; warm: one each)\n", load_rounds);
  fs::remove_all(dir);
  return 0;
}
