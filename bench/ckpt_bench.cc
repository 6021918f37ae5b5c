// ckpt_bench: checkpoint save/load against the disk's own sequential bandwidth D,
// measured in the same run (docs/benchmarks.md, "Checkpoints").
//
//   ckpt_bench [--dir DIR] [--preset qwen2.5-1.5b] [--layers N] [--disk-mb 2048]
//
// Page cache: every timed read first drops the file's pages with
// posix_fadvise(DONTNEED) after an fsync, so reads come from the disk, not memory
// (drop_caches needs privileges this avoids; pages of other processes are untouched).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

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
      if (::write(fd, buf.data(), buf.size()) != static_cast<ssize_t>(buf.size())) die("write failed");
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
      t.emplace_back([&, i] { disk_stream(dir + "/disk_probe." + std::to_string(i), bytes / streams, phase); });
    }
    for (auto& x : t) x.join();
    secs[phase] = seconds_since(t0);
  }
  for (int i = 0; i < streams; ++i) fs::remove(dir + "/disk_probe." + std::to_string(i));
  return {bytes / secs[0], bytes / secs[1]};
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
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--dir") dir = v;
    else if (k == "--preset") preset = v;
    else if (k == "--layers") layers = std::stoll(v);
    else if (k == "--disk-mb") disk_mb = std::stoull(v);
    else die("unknown option " + k);
  }
  dir += "/ckpt_bench." + std::to_string(::getpid());
  fs::create_directories(dir);

  auto [dw1, dr1] = disk_bandwidth(dir, disk_mb << 20, 1);
  auto [dw4, dr4] = disk_bandwidth(dir, disk_mb << 20, 4);
  // D is the better of one stream and four (the save writes 4 files at once).
  const double dw = std::max(dw1, dw4), dr = std::max(dr1, dr4);
  std::printf("disk D, %llu MB: write (fsync included) %.0f MB/s 1 stream, %.0f MB/s 4 streams; "
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
    if (ferry::Status s = c.save(1, v); !s.ok()) die(s.to_string());
  });

  // Async: the blocking part (staging copy) of the first save (cold staging)
  // and of a second one (warm staging), then the time until both are durable.
  std::vector<double> block1(ranks), block2(ranks), block0(ranks);
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
  const double async_total = run_ranks(ranks, nodes, [&](ck::RankGroup& g) {
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
  auto load = [&](int lr, int ln, int dim) {
    drop_tree(dir);
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
    std::uint64_t rb = 0;
    for (auto b : remote) rb += b;
    return std::pair<double, std::uint64_t>(s, rb);
  };
  auto [same_s, same_remote] = load(4, 2, 0);
  auto [re_s, re_remote] = load(8, 4, 0);
  auto [re1_s, re1_remote] = load(2, 2, 1);

  const double gb = total / 1e9;
  std::printf("\n%-44s %9s %10s %s\n", "case", "seconds", "GB/s", "ratio");
  std::printf("%-44s %9.2f %10.2f %.2f of D write (target >= 0.8)\n", "save, 4 ranks / 2 nodes", save_s,
              gb / save_s, total / save_s / dw);
  std::printf("%-44s %9.2f %10s\n", "memcpy of the state (1 thread, warm)", memcpy_s, "");
  std::printf("%-44s %9.2f %10s %.2f x memcpy (target <= 1.3)\n", "async save blocking, first, no staging_bytes",
              blk1, "", blk1 / memcpy_s);
  std::printf("%-44s %9.2f %10s %.2f x memcpy (target <= 1.3)\n", "async save blocking, first, staging_bytes set",
              blk0, "", blk0 / memcpy_s);
  std::printf("%-44s %9.2f %10s %.2f x memcpy (target <= 1.3)\n", "async save blocking, second (warm)",
              blk2, "", blk2 / memcpy_s);
  std::printf("%-44s %9.2f %10.2f\n", "two async saves until durable", async_total, 2 * gb / async_total);
  std::printf("%-44s %9.2f %10.2f %.2f of D read (target >= 0.8)\n", "load, same layout 4 ranks / 2 nodes",
              same_s, gb / same_s, total / same_s / dr);
  std::printf("%-44s %9.2f %10.2f %.2f x same layout (target <= 1.3); %.2f GB fetched\n",
              "load, resharded to 8 ranks / 4 nodes", re_s, gb / re_s, re_s / same_s, re_remote / 1e9);
  std::printf("%-44s %9.2f %10.2f %.2f x same layout; %.2f GB fetched\n",
              "load, resharded to 2 ranks / 2 nodes, dim 1", re1_s, gb / re1_s, re1_s / same_s,
              re1_remote / 1e9);
  (void)same_remote;
  fs::remove_all(dir);
  return 0;
}
