// Files fetched from other nodes over the checkpoint replication protocol's file-set mode
// (include/ferry/megatron.h: ReplicateServeOptions::offer,
// ReplicatePullOptions::only): xxh3_file, FileServer and fetch_files of ferry._ferry.
//
// A file travels as (relative path, bytes, xxh3). The sizes and XXH3s fetch_files checks are
// the caller's; the server's claims are only compared with them. Every transfer and hash runs
// with the GIL released; the server runs on a std::thread of its own that never takes it.
#include <pybind11/stl.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "bindings.h"
#include "ferry/checkpoint.h"
#include "ferry/megatron.h"

namespace ferry::python {
namespace {

using checkpoint::ReplicaFile;
using FileTuple = std::tuple<std::string, std::uint64_t, std::uint64_t>;

std::vector<ReplicaFile> replica_files(const std::vector<FileTuple>& files) {
  std::vector<ReplicaFile> out;
  out.reserve(files.size());
  for (const auto& [path, bytes, xxh3] : files) out.push_back({path, bytes, xxh3});
  return out;
}

// serve_replicas() offering a fixed set of files, on a thread of its own from construction
// until close(). Not copyable or movable (the thread holds `this`).
class FileServer {
 public:
  FileServer(const std::string& root, const std::vector<FileTuple>& files,
             const std::string& address, const std::string& token_file) {
    checkpoint::ReplicaSet set;
    set.files = replica_files(files);
    for (const ReplicaFile& f : set.files) {
      check(checkpoint::validate_relative_path(f.path, "file to serve"));
    }
    checkpoint::ReplicateServeOptions o{.root = root, .address = address, .token_file = token_file};
    o.offer = [set = std::move(set)]() -> Result<checkpoint::ReplicaSet> { return set; };
    o.stop = [this] { return stop_.load(); };
    // Told once: the bound address, or "" when serve_replicas() failed before listening.
    auto startup = std::make_shared<Startup>();
    o.on_listening = [startup](const std::string& a) { startup->tell(a); };
    auto listening = startup->address.get_future();
    thread_ = std::thread([this, o = std::move(o), startup] {
      status_ = serve_replicas(o);  // read only after join()
      startup->tell("");
    });
    {
      py::gil_scoped_release nogil;
      address_ = listening.get();
    }
    if (address_.empty()) {
      join();
      check(status_.ok() ? internal_error("file server ended before listening") : status_);
    }
  }
  ~FileServer() {
    // The GIL is held here (a destructor may run at interpreter exit): the serving thread
    // never takes it, and it notices `stop_` within 50 ms.
    stop_ = true;
    join();
  }
  FileServer(const FileServer&) = delete;
  FileServer& operator=(const FileServer&) = delete;

  const std::string& address() const { return address_; }
  bool closed() const { return closed_; }

  void close() {
    if (closed_) return;
    stop_ = true;
    {
      py::gil_scoped_release nogil;
      join();
    }
    closed_ = true;
  }

 private:
  struct Startup {
    std::promise<std::string> address;
    std::atomic<bool> told{false};
    void tell(const std::string& a) {
      if (!told.exchange(true)) address.set_value(a);
    }
  };
  void join() {
    if (thread_.joinable()) thread_.join();
  }

  std::atomic<bool> stop_{false};
  bool closed_ = false;
  std::string address_;
  Status status_;
  std::thread thread_;
};

}  // namespace

void bind_checkpoint_files(py::module_& m) {
  m.def(
      "xxh3_file",
      [](const std::string& path) {
        Result<std::uint64_t> r = [&] {
          py::gil_scoped_release nogil;
          return checkpoint::xxh3_file(path);
        }();
        return check(std::move(r));
      },
      py::arg("path"),
      "XXH3-64 of a file's contents, read in 8 MiB pieces (the GIL is released meanwhile).");

  py::class_<FileServer>(
      m, "FileServer",
      "Serves files below `root` to fetch_files() over ferry's authenticated net transport, "
      "on a background thread, until close(). `files` is [(relative path, bytes, xxh3)]: "
      "what is offered; each file is checked against its entry again when it is asked for. "
      "`token_file` empty: FERRY_TOKEN, else the file FERRY_TOKEN_FILE names.")
      .def(py::init<const std::string&, const std::vector<FileTuple>&, const std::string&,
                    const std::string&>(),
           py::arg("root"), py::arg("files"), py::arg("address") = "127.0.0.1:0",
           py::arg("token_file") = "",
           "Returns once listening; raises the ferry error when the address cannot be bound, "
           "the token is missing or `root` is not a folder.")
      .def_property_readonly("address", &FileServer::address,
                             "The bound 'host:port' (the real port when 0 was asked).")
      .def_property_readonly("closed", &FileServer::closed, "True once close() ran.")
      .def("close", &FileServer::close, "Stops serving and joins the thread; idempotent.")
      .def("__enter__", [](FileServer& s) -> FileServer& { return s; })
      .def("__exit__", [](FileServer& s, const py::args&) {
        s.close();
        return false;
      });

  m.def(
      "fetch_files",
      [](const std::string& address, const std::string& root, const std::vector<FileTuple>& files,
         const std::string& token_file, std::int64_t timeout_ms) -> std::uint64_t {
        if (timeout_ms <= 0) {
          throw StatusError(
              invalid_argument("timeout_ms must be positive, not " + std::to_string(timeout_ms)));
        }
        if (files.empty()) return 0;
        checkpoint::ReplicatePullOptions o{.root = root,
                                           .from = address,
                                           .token_file = token_file,
                                           .timeout = std::chrono::milliseconds(timeout_ms)};
        o.only = replica_files(files);
        Result<checkpoint::PullResult> r = [&] {
          py::gil_scoped_release nogil;
          return checkpoint::pull_replicas(o);
        }();
        return check(std::move(r)).bytes_copied;
      },
      py::arg("address"), py::arg("root"), py::arg("files"), py::arg("token_file") = "",
      py::arg("timeout_ms") = 30000,
      "Fetches [(relative path, bytes, xxh3)] from the FileServer at `address` into `root`, "
      "each checked against the caller's size and XXH3 (never the server's claim), streamed "
      "to a temp file and renamed; files already there with that size and XXH3 are skipped. "
      "Returns the bytes fetched (0 when all were present, or `files` is empty). Raises "
      "NotFoundError for a file the server does not offer, CorruptionError for other "
      "contents (its message names the server and the file), TimeoutError when nobody "
      "answers at `address`.");
}

}  // namespace ferry::python
