// Collective load of checkpoints, in the saved layout or any other: each rank copies
// the regions it needs from its node's shard files and fetches the rest from peers that
// have them, while serving its own node's shards to the others (docs/checkpoint.md). Every
// slice is checked against the manifest's XXH3 where it is used: read from disk by
// open_checked, and fetched from a peer by the fetching rank too (a peer is not trusted).
#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>

#include "base/log.h"
#include "base/parse_number.h"
#include "base/status_macros.h"
#include "checkpoint/checkpointer_impl.h"
#include "checkpoint/fetch_request.h"

namespace ferry::checkpoint {

using json = nlohmann::json;

Result<CheckedSlice> Checkpointer::Impl::open_checked(LoadState& st, const SavedTensor& t,
                                                      const SavedSlice& s) {
  const std::string path = step_dir(st.step) + "/" + s.file;
  std::shared_ptr<const ShardReader> file;
  {
    MutexLock lock(st.cache.mu);
    auto it = st.cache.files.find(s.file);
    if (it != st.cache.files.end()) file = it->second;
  }
  if (!file) {
    auto opened = st.shards->open(path);
    if (!opened.ok()) return opened.status().with_context("shard of tensor " + t.name);
    file = std::move(*opened);
    MutexLock lock(st.cache.mu);
    st.cache.files.emplace(s.file, file);
  }
  FERRY_ASSIGN_OR_RETURN(const std::span<const std::byte> bytes, file->slice(t, s));
  // Hash each slice once: a second caller (the readahead worker, a peer's request,
  // the loader itself) waits for the first rather than reading the slice again.
  const std::string key = s.file + '\0' + s.tensor_in_file;
  {
    MutexLock lock(st.cache.mu);
    while (st.cache.verifying.count(key)) st.cache.done.wait(st.cache.mu);
    if (st.cache.verified.count(key)) return CheckedSlice{file, bytes};
    st.cache.verifying.insert(key);
  }
  const std::uint64_t got = xxh3(bytes);
  {
    MutexLock lock(st.cache.mu);
    st.cache.verifying.erase(key);
    if (got == s.xxh3) st.cache.verified.insert(key);
  }
  st.cache.done.notify_all();
  if (got != s.xxh3) {
    return corruption(path + ": tensor " + t.name + " slice " +
                      SliceSpec{t.name, t.dtype, t.shape, s.offset, s.extent}.to_string() +
                      ": XXH3 " + hex(got) + " does not match the manifest's " + hex(s.xxh3));
  }
  return CheckedSlice{file, bytes};
}

Result<RankGroup::FetchReply> Checkpointer::Impl::handle_fetch(const std::shared_ptr<LoadState>& st,
                                                               int from, std::string_view request) {
  auto req = decode_fetch_request(request, "rank " + std::to_string(from));
  if (!req.ok()) return req.status();
  if (req->op == FetchRequest::Op::kManifest) {
    auto text = read_file(step_dir(req->step) + "/" + std::string(format::kManifestFile));
    if (!text.ok()) return text.status();
    return RankGroup::FetchReply{std::move(*text), {}, nullptr};
  }
  if (req->step != st->step) {
    return corruption("fetch request for step " + std::to_string(req->step) + " from rank " +
                      std::to_string(from) + " is not being served");
  }
  // Slices the peer asks for next: read them while this one is sent.
  for (const auto& [name, slice] : req->ahead) {
    if (const SavedTensor* h = st->manifest.find(name)) st->read_ahead(*h, slice);
  }
  const SavedTensor* t = st->manifest.find(req->tensor);
  const std::size_t index = req->slice;
  const Box& region = req->region;
  if (t == nullptr || index >= t->slices.size()) {
    return not_found("rank " + std::to_string(from) + " asked for an unknown slice");
  }
  const SavedSlice& s = t->slices[index];
  if (!contains(box_of(s), region)) {
    return corruption("rank " + std::to_string(from) + " asked for a region outside slice " +
                      std::to_string(index) + " of " + t->name);
  }
  if (!st->local_files.count(s.file)) return not_found(s.file + " is not on node " + group.node());
  FERRY_ASSIGN_OR_RETURN(const CheckedSlice c, open_checked(*st, *t, s));
  const std::size_t eb = static_cast<std::size_t>(dtype_bits(t->dtype) / 8);
  const std::size_t n = static_cast<std::size_t>(region.volume()) * eb;
  if (auto at = contiguous_offset(region, box_of(s))) {  // sent straight from the file's bytes
    return RankGroup::FetchReply{
        {}, c.bytes.subspan(static_cast<std::size_t>(*at) * eb, n), c.file};
  }
  std::string out(n, '\0');
  copy_region(region, c.bytes, box_of(s), {reinterpret_cast<std::byte*>(out.data()), out.size()},
              region, eb);
  return RankGroup::FetchReply{std::move(out), {}, nullptr};
}

namespace {

// What phase 1 learns: the ranks on whose nodes each step is committed, and has a manifest.
struct StepHolders {
  std::map<std::int64_t, std::vector<int>> committed_on, manifest_on;
};

// Phase 1: what every node holds.
Result<StepHolders> gather_step_lists(RankGroup& g, const std::string& root) {
  json mine = json::object();
  for (std::int64_t step : format::list_step_folders(root)) {
    NodeStepState ns = format::scan_step(root, step);
    mine[std::to_string(step)] = {{"committed", ns.committed}, {"manifest", ns.manifest}};
  }
  auto all = g.all_gather(mine.dump());
  if (!all.ok()) return all.status().with_context("checkpoint load");
  StepHolders h;
  for (int r = 0; r < g.size(); ++r) {
    FERRY_RETURN_IF_ERROR(read_from_rank(r, "step list", [&] {
      const json j = json::parse((*all)[r]);
      for (const auto& [k, v] : j.items()) {
        const auto step = parse_uint(k);
        if (!step) {
          return corruption("malformed step list from rank " + std::to_string(r) + ": '" + k +
                            "' is not a step number");
        }
        if (v.value("committed", false)) h.committed_on[*step].push_back(r);
        if (v.value("manifest", false)) h.manifest_on[*step].push_back(r);
      }
      return ok_status();
    }));
  }
  return h;
}

// Phase 1's choice: `wanted` if it is committed somewhere, else the newest committed step.
Result<std::int64_t> choose_step(const StepHolders& h, std::optional<std::int64_t> wanted,
                                 const std::string& root, const std::string& node) {
  if (wanted) {
    if (!h.committed_on.count(*wanted)) {
      return failed_precondition("checkpoint step " + std::to_string(*wanted) +
                                 " is not committed on any node" +
                                 (h.manifest_on.count(*wanted) ? " (it is partial)" : ""));
    }
    return *wanted;
  }
  if (h.committed_on.empty()) {
    return not_found("no committed checkpoint on any node (root " + root + " on node " + node +
                     ")");
  }
  return h.committed_on.rbegin()->first;
}

// Phase 2: the manifest's text, from this node's disk, else fetched from a rank whose node
// has it (said in *notes).
Result<std::string> read_or_fetch_manifest(RankGroup& g, const std::string& dir, std::int64_t step,
                                           const std::vector<int>& holders,
                                           std::vector<std::string>* notes) {
  if (auto local = read_file(dir + "/" + std::string(format::kManifestFile)); local.ok()) {
    return local;
  }
  if (holders.empty()) {
    return not_found("no node has the manifest of step " + std::to_string(step));
  }
  const int peer = holders.front();
  FetchRequest q{.op = FetchRequest::Op::kManifest, .step = step};
  auto fetched = g.fetch(peer, encode_fetch_request(q));
  if (!fetched.ok()) {
    return fetched.status().with_context("fetching the manifest of step " + std::to_string(step));
  }
  notes->push_back("node " + g.node() + " has no manifest for step " + std::to_string(step) +
                   "; fetched it from rank " + std::to_string(peer));
  return fetched;
}

// Phase 2's check of the text: a manifest of `step`.
Result<Manifest> decode_step_manifest(const std::string& text, const std::string& dir,
                                      std::int64_t step) {
  auto decoded = format::decode_manifest(text, dir + "/" + std::string(format::kManifestFile));
  if (!decoded.ok()) return decoded.status();
  if (decoded->step != step) return corruption(dir + ": manifest is of another step");
  return decoded;
}

// Phase 3: the manifest's files this node holds whole (present, of the right size).
std::vector<std::string> files_held(const std::string& dir, const Manifest& manifest) {
  std::vector<std::string> held;
  for (const SavedFile& f : manifest.files) {
    struct stat sb {};
    if (::stat((dir + "/" + f.file).c_str(), &sb) == 0 &&
        static_cast<std::uint64_t>(sb.st_size) == f.bytes) {
      held.push_back(f.file);
    }
  }
  return held;
}

// Phase 3's exchange: every rank's status, files, notes and manifest hash. Fails alike on
// every rank when one failed or the manifests differ; else fills st->file_ranks and *notes
// (every rank's notes, each once).
Status exchange_reports(RankGroup& g, const Status& mine, const std::vector<std::string>& held,
                        const std::string& manifest_text, std::int64_t step, LoadState* st,
                        std::vector<std::string>* notes) {
  json report = {{"code", static_cast<int>(mine.code())},
                 {"message", mine.message()},
                 {"files", held},
                 {"notes", *notes},
                 {"xxh3", hex(xxh3(std::as_bytes(std::span(manifest_text))))}};
  auto reports = g.all_gather(report.dump());
  if (!reports.ok()) return reports.status().with_context("checkpoint load");
  for (const std::string& note : *notes) log::info("checkpoint: {}", note);
  notes->clear();  // every rank hears every rank's notes
  std::string first_hash;
  for (int r = 0; r < g.size(); ++r) {
    FERRY_RETURN_IF_ERROR(read_from_rank(r, "file list", [&] {
      const json j = json::parse((*reports)[r]);
      if (j.value("code", 0) != 0) {
        if (r == g.rank()) return mine;
        return aborted("checkpoint load: rank " + std::to_string(r) +
                       " failed: " + j.value("message", std::string()));
      }
      const std::string h = j.value("xxh3", "");
      if (r == 0) first_hash = h;
      if (h != first_hash) {
        return corruption("the manifests of step " + std::to_string(step) +
                          " on rank 0's and rank " + std::to_string(r) + "'s nodes differ");
      }
      for (const json& f : j.at("files")) st->file_ranks[f.get<std::string>()].push_back(r);
      for (const json& n : j.at("notes")) {
        const std::string note = n.get<std::string>();
        if (std::find(notes->begin(), notes->end(), note) == notes->end()) notes->push_back(note);
      }
      return ok_status();
    }));
  }
  return ok_status();
}

}  // namespace

Result<LoadInfo> Checkpointer::prepare_load(std::optional<std::int64_t> wanted) {
  FERRY_RETURN_IF_ERROR(wait());
  Impl& m = *impl_;
  RankGroup& g = m.group;
  auto st = std::make_shared<LoadState>();
  // Serve manifests and slices from now until the end of load().
  g.set_fetch_handler(
      [&m, st](int from, std::string_view req) { return m.handle_fetch(st, from, req); });

  // 1. What every node holds, and the step to load.
  FERRY_ASSIGN_OR_RETURN(const StepHolders holders, gather_step_lists(g, m.opts.root));
  LoadInfo info;
  FERRY_ASSIGN_OR_RETURN(info.step, choose_step(holders, wanted, m.opts.root, g.node()));
  st->step = info.step;
  const std::string dir = m.step_dir(info.step);
  const auto& committers = holders.committed_on.at(info.step);
  if (std::none_of(committers.begin(), committers.end(), [&](int r) { return g.rank() == r; }) &&
      format::file_exists(dir + "/" + std::string(format::kManifestFile))) {
    info.notes.push_back("step " + std::to_string(info.step) + " is committed on rank " +
                         std::to_string(committers.front()) + "'s node but not on node " +
                         g.node() + " (its save was interrupted after the global commit began)");
  }

  // 2. The manifest. A failure here is reported in phase 3, so every rank fails alike.
  const auto holders_of_manifest = holders.manifest_on.find(info.step);
  auto text = read_or_fetch_manifest(g, dir, info.step,
                                     holders_of_manifest == holders.manifest_on.end()
                                         ? std::vector<int>()
                                         : holders_of_manifest->second,
                                     &info.notes);
  Status s = text.status();
  if (s.ok()) {
    auto manifest = decode_step_manifest(*text, dir, info.step);
    s = manifest.status();
    if (s.ok()) st->manifest = std::move(*manifest);
    if (s.ok()) {
      auto shards = shard_format_for(st->manifest.shard_format);  // decoding checked the name
      s = shards.status();
      if (s.ok()) st->shards = *shards;
    }
  }

  // 3. Which files each rank can read from its own disk.
  std::vector<std::string> held;
  if (s.ok()) {
    held = files_held(dir, st->manifest);
    st->local_files.insert(held.begin(), held.end());
    st->verify_ahead = [&m, raw = st.get()](SliceReadahead::Key k) {
      const SavedTensor& t = raw->manifest.tensors[k.first];
      (void)m.open_checked(*raw, t, t.slices[k.second]);  // the reader reports errors
    };
  }
  FERRY_RETURN_IF_ERROR(exchange_reports(g, s, held, text.ok() ? *text : std::string(), info.step,
                                         st.get(), &info.notes));
  info.manifest = st->manifest;
  m.load = st;
  return info;
}

namespace {

// One saved slice's part of one destination.
struct Piece {
  const SavedTensor* tensor;
  std::size_t slice;  // index in tensor->slices
  const MutableSliceView* dest;
  Box region;  // global coordinates, inside the slice and the destination
  int peer;    // the rank to fetch from; -1: this node's disk

  const SavedSlice& saved() const { return tensor->slices[slice]; }
  std::size_t element_bytes() const {
    return static_cast<std::size_t>(std::max(1, dtype_bits(tensor->dtype) / 8));
  }
  std::size_t bytes() const { return static_cast<std::size_t>(region.volume()) * element_bytes(); }
};

// One saved slice that pieces fetch from a peer, with those pieces (of one or more
// destinations), in the order plan_load made them.
struct RemoteSlice {
  const SavedTensor* tensor;
  std::size_t slice;  // index in tensor->slices
  int peer;           // the same for every piece: plan_load picks it by file
  std::vector<const Piece*> pieces;

  const SavedSlice& saved() const { return tensor->slices[slice]; }
};

// Groups remote pieces by the saved slice they read, in the order of each slice's first
// piece, so a slice that several pieces need parts of is fetched and verified once.
std::vector<RemoteSlice> group_by_slice(const std::vector<const Piece*>& remote) {
  std::vector<RemoteSlice> out;
  std::map<std::string, std::size_t> at;  // keyed like open_checked's cache: "file\0tensor"
  for (const Piece* p : remote) {
    const SavedSlice& s = p->saved();
    auto [it, fresh] = at.emplace(s.file + '\0' + s.tensor_in_file, out.size());
    if (fresh) out.push_back({p->tensor, p->slice, p->peer, {}});
    out[it->second].pieces.push_back(p);
  }
  return out;
}

// The read-ahead window over `slices`, in their order.
template <typename T>
AheadWindow window_over(const std::vector<const T*>& slices) {
  std::vector<std::uint64_t> bytes;
  for (const T* p : slices) bytes.push_back(p->saved().bytes);
  return AheadWindow(std::move(bytes));
}

// Whether `got`, fetched from rank `peer`, is slice `s` of `t` as saved: the XXH3 of the
// whole slice against the manifest's. The peer checked its file before sending, but the
// bytes come from another process (faulty, hostile, or its file changed since): trust
// only the manifest, whose hash every rank agreed on in prepare_load.
Status check_fetched(const SavedTensor& t, const SavedSlice& s, int peer,
                     std::span<const std::byte> got) {
  const std::uint64_t h = xxh3(got);
  if (h == s.xxh3) return ok_status();
  return corruption("rank " + std::to_string(peer) + " sent tensor " + t.name + " slice " +
                    SliceSpec{t.name, t.dtype, t.shape, s.offset, s.extent}.to_string() + " (" +
                    s.file + ") with XXH3 " + hex(h) + ", which does not match the manifest's " +
                    hex(s.xxh3));
}

// Splits the destinations into pieces, one per saved slice each overlaps: from this
// node's disk when a replica is here, else from a rank that has the file.
Status plan_load(const LoadState& st, const std::string& dir,
                 std::span<const MutableSliceView> destinations, std::vector<Piece>* pieces) {
  for (const MutableSliceView& d : destinations) {
    FERRY_RETURN_IF_ERROR(d.spec.validate());
    const SavedTensor* t = st.manifest.find(d.spec.name);
    if (t == nullptr) {
      return not_found("tensor " + d.spec.name + " is not in checkpoint step " +
                       std::to_string(st.step));
    }
    if (t->dtype != d.spec.dtype || t->shape != d.spec.global_shape) {
      return invalid_argument("tensor " + d.spec.name + " is saved as " +
                              TensorSpec{t->name, t->dtype, t->shape}.to_string() +
                              ", asked for as " +
                              TensorSpec{t->name, d.spec.dtype, d.spec.global_shape}.to_string());
    }
    if (d.data.size() != d.spec.bytes()) {
      return invalid_argument("destination of " + d.spec.to_string() + " has the wrong size");
    }
    const Box want = box_of(d.spec);
    // Prefer a replica this node has; take each distinct box once.
    std::vector<std::size_t> order(t->slices.size());
    for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
      return st.local_files.count(t->slices[a].file) > st.local_files.count(t->slices[b].file);
    });
    std::vector<Box> done;
    for (std::size_t i : order) {
      const SavedSlice& sl = t->slices[i];
      const Box src = box_of(sl);
      if (std::find(done.begin(), done.end(), src) != done.end()) continue;
      auto region = intersect(want, src);
      if (!region) continue;
      done.push_back(src);
      int peer = -1;
      if (!st.local_files.count(sl.file)) {
        auto owners = st.file_ranks.find(sl.file);
        if (owners == st.file_ranks.end() || owners->second.empty()) {
          return not_found("shard " + sl.file + " of tensor " + t->name + " (rank " +
                           std::to_string(sl.rank) + ", node " +
                           st.manifest.layout.rank_nodes[sl.rank] +
                           ") is on no node of this load: missing or truncated in " + dir);
        }
        // Every reader of a file asks the same holder, so it is read and hashed once;
        // files spread over the holders by the rank that saved them.
        peer = owners->second[static_cast<std::size_t>(sl.rank) % owners->second.size()];
      }
      pieces->push_back({t, i, &d, std::move(*region), peer});
    }
  }
  return ok_status();
}

}  // namespace

Result<LoadStats> Checkpointer::load(std::span<const MutableSliceView> destinations) {
  Impl& m = *impl_;
  RankGroup& g = m.group;
  if (!m.load) return failed_precondition("Checkpointer::load() needs prepare_load() first");
  auto st = m.load;
  const std::string dir = m.step_dir(st->step);
  std::vector<Piece> pieces;
  Status s = plan_load(*st, dir, destinations, &pieces);
  std::vector<const Piece*> local, remote;
  for (const Piece& p : pieces) (p.peer < 0 ? local : remote).push_back(&p);

  // Fetches run on their own thread while this one copies from disk, so the network
  // and the disk work at once; either stops early when the other fails.
  std::atomic<bool> failed{false};
  LoadStats stats;
  Status fetched;
  std::thread fetcher;
  if (s.ok() && !remote.empty()) {
    fetcher = std::thread([&] {
      // Every fetch asks for a whole saved slice (its full box), the unit the manifest's
      // XXH3 covers, so what arrives is checked before load() reports success.
      const std::vector<RemoteSlice> slices = group_by_slice(remote);
      // Each request names the peer's next slices, which it reads while it sends this one.
      std::map<int, std::vector<const RemoteSlice*>> by_peer;
      std::map<const RemoteSlice*, std::size_t> position;
      for (const RemoteSlice& r : slices) {
        position[&r] = by_peer[r.peer].size();
        by_peer[r.peer].push_back(&r);
      }
      std::map<int, AheadWindow> windows;
      for (auto& [peer, list] : by_peer) windows.emplace(peer, window_over(list));
      std::uint64_t unused = 0;  // fetched to verify whole slices, outside every piece
      for (const RemoteSlice& r : slices) {
        if (failed) return;
        const SavedTensor& t = *r.tensor;
        const SavedSlice& sl = r.saved();
        const Box box = box_of(sl);
        FetchRequest q{.op = FetchRequest::Op::kSlice,
                       .step = st->step,
                       .tensor = t.name,
                       .slice = r.slice,
                       .region = box,
                       .ahead = {}};
        const auto [first, last] = windows.at(r.peer).advance(position[&r]);
        const std::vector<const RemoteSlice*>& list = by_peer[r.peer];
        for (std::size_t a = first; a < last; ++a) {
          q.ahead.emplace_back(list[a]->tensor->name, list[a]->slice);
        }
        const std::string request = encode_fetch_request(q);
        const Piece& p0 = *r.pieces.front();
        const std::size_t eb = p0.element_bytes();
        std::optional<std::int64_t> at;
        if (r.pieces.size() == 1 && p0.region == box)
          at = contiguous_offset(box, box_of(p0.dest->spec));
        Status f;
        if (at) {
          // The whole slice, one run of its destination: fetched and verified in place. On
          // a mismatch the destination keeps the unverified bytes; load() then fails, and
          // a failed load's destinations hold nothing to use.
          const std::span<std::byte> dst =
              p0.dest->data.subspan(static_cast<std::size_t>(*at) * eb, sl.bytes);
          f = g.fetch_into(r.peer, request, dst);
          if (f.ok()) f = check_fetched(t, sl, r.peer, dst);
        } else {
          // Parts of the slice (a resharded load), or a slice not contiguous in its
          // destination: the whole slice into a buffer, verified, then each piece's region
          // copied out. One such buffer at a time, freed before the next fetch.
          const auto buffer = std::make_unique_for_overwrite<std::byte[]>(sl.bytes);
          const std::span<std::byte> whole(buffer.get(), sl.bytes);
          f = g.fetch_into(r.peer, request, whole);
          if (f.ok()) f = check_fetched(t, sl, r.peer, whole);
          if (f.ok()) {
            for (const Piece* p : r.pieces) {
              copy_region(p->region, whole, box, p->dest->data, box_of(p->dest->spec), eb);
            }
          }
        }
        if (!f.ok()) {
          fetched = f.with_context("fetching " + t.name + " from rank " + std::to_string(r.peer));
          failed = true;
          return;
        }
        std::uint64_t used = 0;
        for (const Piece* p : r.pieces) {
          used += p->bytes();
          stats.remote_bytes += p->bytes();
          if (m.opts.progress) m.opts.progress(p->bytes());
        }
        unused += sl.bytes > used ? sl.bytes - used : 0;
      }
      if (unused > 0) {
        log::debug(
            "checkpoint load: fetched {} bytes beyond the regions asked for, to verify "
            "whole slices",
            unused);
      }
    });
  }
  if (s.ok()) {
    AheadWindow window = window_over(local);
    for (std::size_t i = 0; i < local.size() && !failed; ++i) {
      const Piece& p = *local[i];
      const auto [first, last] = window.advance(i);
      for (std::size_t a = first; a < last; ++a) st->read_ahead(*local[a]->tensor, local[a]->slice);
      auto c = m.open_checked(*st, *p.tensor, p.saved());
      if (!c.ok()) {
        s = c.status();
        failed = true;
        break;
      }
      const Box src = box_of(p.saved()), want = box_of(p.dest->spec);
      if (src == want)
        std::memcpy(p.dest->data.data(), c->bytes.data(), c->bytes.size());
      else
        copy_region(p.region, c->bytes, src, p.dest->data, want, p.element_bytes());
      stats.local_bytes += p.bytes();
      if (m.opts.progress) m.opts.progress(p.bytes());
    }
  }
  if (fetcher.joinable()) fetcher.join();
  if (s.ok()) s = fetched;
  // Serve the others until every rank is done, then stop.
  Status all = agree(g, s, "checkpoint load step " + std::to_string(st->step));
  g.set_fetch_handler({});
  m.load.reset();
  if (!all.ok()) return all;
  return stats;
}

}  // namespace ferry::checkpoint
