// ferry.sync for Python: Sender, Receiver and Relay over include/ferry/sync.h.
//
// Tensors arrive from Python as (name, dtype, shape, address, nbytes) or
// (name, dtype, shape, buffer) tuples; the Python layer keeps the memory alive
// and contiguous. Every transfer runs with the GIL released; callbacks take it
// back only while they run.
#include "ferry/sync.h"

#include <fmt/format.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string_view>
#include <thread>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "bindings.h"
#include "ferry/multi_receiver.h"
#include "ferry/sender_parts.h"
#include "ferry/sync_option_fields.h"

namespace ferry::python {
namespace {

using sync::RoundStats;
using sync::SyncOptions;

// A Py_buffer held for as long as C++ reads (or writes) the memory.
class BufferHold {
 public:
  BufferHold(const py::handle& obj, bool writable) {
    const int flags = PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj.ptr(), &view_, flags) != 0) throw py::error_already_set();
  }
  ~BufferHold() { PyBuffer_Release(&view_); }
  BufferHold(const BufferHold&) = delete;
  BufferHold& operator=(const BufferHold&) = delete;

  std::byte* data() const { return static_cast<std::byte*>(view_.buf); }
  std::size_t size() const { return static_cast<std::size_t>(view_.len); }

 private:
  Py_buffer view_{};
};

// One tensor argument: its spec and the memory given for it.
struct TensorArg {
  TensorSpec spec;
  std::byte* data = nullptr;
  std::size_t size = 0;
  std::unique_ptr<BufferHold> hold;  // when the memory came as a buffer object
};

TensorArg tensor_arg(const py::handle& item, bool writable) {
  const auto t = item.cast<py::tuple>();
  if (t.size() != 4 && t.size() != 5) {
    throw StatusError(invalid_argument(
        "a tensor is (name, dtype, shape, address, nbytes) or (name, dtype, shape, buffer)"));
  }
  TensorArg arg;
  arg.spec = check(
      TensorSpec::make(t[0].cast<std::string>(), t[1].cast<DType>(), shape_from_python(t[2])));
  if (t.size() == 5) {
    arg.data = reinterpret_cast<std::byte*>(t[3].cast<std::uintptr_t>());
    arg.size = t[4].cast<std::size_t>();
  } else {
    arg.hold = std::make_unique<BufferHold>(t[3], writable);
    arg.data = arg.hold->data();
    arg.size = arg.hold->size();
  }
  if (arg.size != arg.spec.bytes()) {
    throw StatusError(
        invalid_argument(fmt::format("tensor '{}': {} bytes given, {} needs {}", arg.spec.name,
                                     arg.size, arg.spec.to_string(), arg.spec.bytes())));
  }
  if (arg.data == nullptr && arg.size != 0) {
    throw StatusError(invalid_argument(fmt::format("tensor '{}': null address", arg.spec.name)));
  }
  return arg;
}

// A round's manifest given as (name, dtype, shape) tuples.
// Keeps two Python threads from using one Sender/Receiver at once (the C++ objects
// are single-threaded) and reports it instead of corrupting the session.
class UseGuard {
 public:
  UseGuard(std::mutex& mutex, const char* what) : lock_(mutex, std::try_to_lock) {
    if (!lock_.owns_lock()) {
      throw StatusError(failed_precondition(
          fmt::format("the {} is in use by another thread: one call at a time", what)));
    }
  }

 private:
  std::unique_lock<std::mutex> lock_;
};

// SyncOptions' fields as Python sees them (ferry/sync_option_fields.h's kinds): numbers,
// bools and strings as they are, times in seconds (a negative time, wait forever, is -1),
// WireProtect and DeltaMode by name.
double seconds(std::chrono::milliseconds ms) {
  return ms.count() < 0 ? -1.0 : static_cast<double>(ms.count()) / 1000.0;
}

template <typename T>
auto to_python(const T& value) {
  if constexpr (std::is_same_v<T, std::chrono::milliseconds>) {
    return seconds(value);
  } else if constexpr (std::is_same_v<T, WireProtect>) {
    return std::string(wire_protect_name(value));
  } else if constexpr (std::is_same_v<T, sync::DeltaMode>) {
    return std::string(sync::delta_mode_name(value));
  } else {
    return value;
  }
}

template <typename T>
using PythonType = decltype(to_python(std::declval<T>()));

// Option `name`'s value from Python; one that does not parse raises InvalidArgumentError
// naming the option.
template <typename T>
T from_python(std::string_view name, const PythonType<T>& value) {
  const auto parsed = [name](auto result) {
    if (!result.ok()) {
      throw StatusError(
          invalid_argument(fmt::format("SyncOptions.{}: {}", name, result.status().message())));
    }
    return *std::move(result);
  };
  if constexpr (std::is_same_v<T, std::chrono::milliseconds>) {
    if (std::isnan(value)) {
      throw StatusError(invalid_argument(
          fmt::format("SyncOptions.{}: nan seconds: give seconds, or -1 to wait forever", name)));
    }
    // Negative, infinite, or past what milliseconds hold (292 million years): forever.
    if (value < 0 || value * 1000.0 >= 9.2e18) return std::chrono::milliseconds(-1);
    return std::chrono::milliseconds(static_cast<std::int64_t>(value * 1000.0));
  } else if constexpr (std::is_same_v<T, WireProtect>) {
    return parsed(parse_wire_protect(value));
  } else if constexpr (std::is_same_v<T, sync::DeltaMode>) {
    return parsed(sync::parse_delta_mode(value));
  } else {
    return value;
  }
}

// Every field ferry.SyncOptions binds, in the tables' order: session, sender, receiver.
constexpr auto kBoundOptionFields =
    std::tuple_cat(sync::bound_option_fields<sync::kSessionOptionFields>(),
                   sync::bound_option_fields<sync::kSenderOptionFields>(),
                   sync::bound_option_fields<sync::kReceiverOptionFields>());

template <std::size_t I>
using BoundOptionValue = typename std::tuple_element_t<I, decltype(kBoundOptionFields)>::Value;

// SyncOptions(*, name=default, ...) with one keyword per bound field.
template <std::size_t... I>
void def_options_init(py::class_<SyncOptions>& cls, std::index_sequence<I...>) {
  const SyncOptions defaults;
  cls.def(py::init([](const PythonType<BoundOptionValue<I>>&... values) {
            SyncOptions o;
            ((o.*std::get<I>(kBoundOptionFields).member =
                  from_python<BoundOptionValue<I>>(std::get<I>(kBoundOptionFields).name, values)),
             ...);
            return o;
          }),
          py::kw_only(),
          (py::arg(std::get<I>(kBoundOptionFields).name.data()) =
               to_python(defaults.*std::get<I>(kBoundOptionFields).member))...,
          "Options by keyword; each one left out keeps the C++ default.");
}

// A property reading and writing `field` in Python's units.
template <typename Field>
void def_option_property(py::class_<SyncOptions>& cls, const Field& field) {
  using T = typename Field::Value;
  const auto member = field.member;
  const std::string_view name = field.name;
  cls.def_property(
      field.name.data(), [member](const SyncOptions& o) { return to_python(o.*member); },
      [member, name](SyncOptions& o, const PythonType<T>& value) {
        o.*member = from_python<T>(name, value);
      },
      field.doc.data());
}

// "SyncOptions(timeout=60.0, ...)": every bound field, each value as Python writes it.
std::string options_repr(const SyncOptions& o) {
  std::string fields;
  std::apply(
      [&](const auto&... field) {
        ((fields += fmt::format("{}{}={}", fields.empty() ? "" : ", ", field.name,
                                std::string(py::repr(py::cast(to_python(o.*field.member)))))),
         ...);
      },
      kBoundOptionFields);
  return "SyncOptions(" + fields + ")";
}

// Ctrl-C while C++ waits with the GIL released: SyncOptions::interrupt runs Python's
// signal handlers (they run in the main thread only, as in Python itself); an exception
// they raise (KeyboardInterrupt) ends the wait, and is raised again once the call returns.
// Owned by the Python object, which outlives the C++ session holding the hook.
class Interrupts {
 public:
  std::function<Status()> hook() {
    return [this]() -> Status {
      if (stopped_.load()) {
        std::lock_guard<std::mutex> lock(stop_mutex_);
        return aborted(stop_reason_);
      }
      py::gil_scoped_acquire gil;
      if (PyErr_CheckSignals() == 0) return ok_status();
      py::error_already_set e;  // takes the pending exception
      std::string type = py::str(e.type().attr("__name__"));
      pending_.emplace(std::move(e));
      return aborted(fmt::format("interrupted ({})", type));
    };
  }
  // From any thread: the session's waits end within about 100 ms, failing with `why` (the
  // first reason given wins).
  void stop(std::string why) {
    std::lock_guard<std::mutex> lock(stop_mutex_);
    if (stopped_.load()) return;
    stop_reason_ = std::move(why);
    stopped_.store(true);
  }
  // The reason stop() gave, if it was called.
  std::optional<std::string> stopped() {
    if (!stopped_.load()) return std::nullopt;
    std::lock_guard<std::mutex> lock(stop_mutex_);
    return stop_reason_;
  }
  // With the GIL held, after a call that may have been interrupted.
  void raise_pending() {
    if (!pending_) return;
    py::error_already_set e = std::move(*pending_);
    pending_.reset();
    throw e;
  }

 private:
  std::optional<py::error_already_set> pending_;
  std::atomic<bool> stopped_{false};
  std::mutex stop_mutex_;
  std::string stop_reason_;
};

SyncOptions with_interrupts(SyncOptions o, Interrupts& interrupts) {
  o.interrupt = interrupts.hook();
  return o;
}

// What Sender, Receiver and Relay share: the C++ object (null once closed), the guard
// that lets one thread call at a time, and the Ctrl-C hook its session points at.
template <typename Impl>
class Endpoint {
 public:
  bool closed() const { return impl_ == nullptr; }
  Impl& get() const {
    if (!impl_) throw StatusError(failed_precondition(fmt::format("the {} is closed", what_)));
    return *impl_;
  }

 protected:
  explicit Endpoint(const char* what) : what_(what) {}

  // Ends the session with the GIL released (peers may be told).
  void reset() {
    UseGuard use(mutex_, what_);
    py::gil_scoped_release nogil;
    impl_.reset();
  }

  const char* what_;
  std::mutex mutex_;
  Interrupts interrupts_;  // before impl_: the session's hook points at it
  std::unique_ptr<Impl> impl_;
};

// Runs a transfer with the GIL released, re-taking it for each Python callback. A Python
// exception in a callback aborts the round (the peer hears why, `who` raised it) and is
// then raised again by finish(), unchanged.
class CallbackBridge {
 public:
  template <typename F>
  Status call(F&& f, std::string_view who = "the receiver's callback") {
    py::gil_scoped_acquire gil;
    try {
      f();
      return ok_status();
    } catch (py::error_already_set& e) {
      std::string type = py::str(e.type().attr("__name__"));
      std::string text = py::str(e.value());
      if (!saved_) saved_.emplace(std::move(e));
      return aborted(fmt::format("{} raised {}: {}", who, type, text));
    }
  }

  template <typename T>
  T finish(Result<T> r) {
    raise_saved();
    return check(std::move(r));
  }
  // The callback's exception, if one was raised: again, unchanged (once).
  void raise_saved() {
    if (!saved_) return;
    py::error_already_set e = std::move(*saved_);
    saved_.reset();
    throw e;
  }

 private:
  std::optional<py::error_already_set> saved_;
};

class PySender : public Endpoint<sync::Sender> {
 public:
  PySender() : Endpoint("sender") {}
  static std::unique_ptr<PySender> create(const std::string& address, const SyncOptions& o) {
    auto s = std::make_unique<PySender>();
    Result<std::unique_ptr<sync::Sender>> r = [&] {
      py::gil_scoped_release nogil;
      return sync::Sender::create(address, with_interrupts(o, s->interrupts_));
    }();
    s->interrupts_.raise_pending();
    s->impl_ = check(std::move(r));
    return s;
  }

  void accept(std::uint32_t receivers) {
    UseGuard use(mutex_, what_);
    sync::Sender& s = get();
    Status st = [&] {
      py::gil_scoped_release nogil;
      return s.accept(receivers);
    }();
    interrupts_.raise_pending();
    check(st);
  }

  RoundStats send_round(const py::sequence& weights, bool more_follows,
                        std::optional<std::uint64_t> step) {
    UseGuard use(mutex_, what_);
    sync::Sender& s = get();
    std::vector<TensorArg> args;
    args.reserve(weights.size());
    for (const py::handle& item : weights) args.push_back(tensor_arg(item, /*writable=*/false));
    std::vector<TensorView> views;
    views.reserve(args.size());
    for (TensorArg& a : args) views.push_back({std::move(a.spec), {a.data, a.size}});
    Result<RoundStats> r = [&] {
      py::gil_scoped_release nogil;
      return s.send_round(views, sync::RoundOptions{more_follows, step});
    }();
    interrupts_.raise_pending();
    return check(std::move(r));
  }

  py::tuple ring_memory() const {
    const std::span<std::byte> ring = get().ring_memory();
    return py::make_tuple(reinterpret_cast<std::uintptr_t>(ring.data()), ring.size());
  }

  void close() { reset(); }

 private:
  friend class PyUpdateWriter;
};

// One update pushed from Python a tensor at a time (sync::UpdateWriter). Each call holds
// every Sender of the update, so nothing else runs on them meanwhile; a Sender closed
// mid-update aborts it. ferry.sync drives it from asyncio with start_put() and wait(): the
// update's own thread copies the tensor without the GIL while the event loop's thread waits
// a few milliseconds (a tensor's copy), then waits in an executor (a slot's wait), so a
// coroutine on the same loop, e.g. a colocated receiver, runs meanwhile.
class PyUpdateWriter {
 private:
  // Runs f(the Senders) with every Sender held and the GIL released; raises its error.
  template <typename F>
  auto call(F&& f) {
    std::unique_lock<std::mutex> own = claim();
    auto r = [&] {
      py::gil_scoped_release nogil;
      return held(f);
    }();
    for (PySender* end : ends_) end->interrupts_.raise_pending();
    bridge_.raise_saved();  // a producer's or flush()'s exception, unchanged
    return check(std::move(r));
  }

  // This call's turn: one call at a time, none while a started put is not waited for.
  std::unique_lock<std::mutex> claim() {
    std::unique_lock<std::mutex> own(mutex_, std::try_to_lock);
    if (!own.owns_lock() || putting_) {
      throw StatusError(failed_precondition(
          "the update is in use: one call at a time (wait() for a started put first)"));
    }
    return own;
  }

  // f(the Senders) with every Sender held; a Sender in use elsewhere is an error.
  template <typename F>
  auto held(F&& f) -> decltype(f(std::span<sync::Sender* const>())) {
    std::vector<std::unique_ptr<UseGuard>> uses;
    std::vector<sync::Sender*> impls;
    try {
      for (PySender* end : ends_) {
        uses.push_back(std::make_unique<UseGuard>(end->mutex_, end->what_));
        impls.push_back(writer_ ? nullptr : &end->get());  // only begin uses them
      }
    } catch (const StatusError& e) {
      return e.status();
    }
    return f(std::span<sync::Sender* const>(impls));
  }

 public:
  ~PyUpdateWriter() {
    if (!worker_.joinable()) return;
    {
      std::lock_guard<std::mutex> lock(job_mutex_);
      quit_ = true;
    }
    job_changed_.notify_all();
    py::gil_scoped_release nogil;
    worker_.join();  // after the put in flight, if any
  }

  // An update to every Sender of `senders` (sync::UpdateWriter::begin). `flush`, needed by
  // start_produce, completes the copies its producers started (taking the GIL).
  static std::unique_ptr<PyUpdateWriter> update(const py::sequence& senders,
                                                std::optional<std::uint64_t> step,
                                                std::uint64_t staging_bytes,
                                                const py::object& flush) {
    auto w = std::unique_ptr<PyUpdateWriter>(new PyUpdateWriter(senders));
    sync::UpdateOptions options{step, staging_bytes};
    if (!flush.is_none()) {
      w->flush_ = flush;
      options.flush = [self = w.get()] {
        return self->bridge_.call([&] { self->flush_(); }, "the sender's flush()");
      };
    }
    w->writer_ = w->call([&](std::span<sync::Sender* const> impls) {
      return sync::UpdateWriter::begin(impls, options);
    });
    return w;
  }

  // One round to `sender` streamed against `specs` (sync::UpdateWriter::begin_round).
  static std::unique_ptr<PyUpdateWriter> round(const py::object& sender, const py::sequence& specs,
                                               bool more_follows,
                                               std::optional<std::uint64_t> step) {
    const std::vector<TensorSpec> manifest = specs_from_python(specs);
    auto w = std::unique_ptr<PyUpdateWriter>(new PyUpdateWriter(py::make_tuple(sender)));
    w->writer_ = w->call([&](std::span<sync::Sender* const> impls) {
      return sync::UpdateWriter::begin_round(impls[0], manifest,
                                             sync::RoundOptions{more_follows, step});
    });
    return w;
  }

  // A tensor argument ((name, dtype, shape, address, nbytes) or (name, dtype, shape,
  // buffer)), copied before this returns.
  void put(const py::handle& tensor) {
    TensorArg a = tensor_arg(tensor, /*writable=*/false);
    const TensorView view{std::move(a.spec), {a.data, a.size}};
    call([&](auto) { return writer().put(view); });
  }

  // put() in the update's own thread: returns at once; wait() says when it is done.
  void start_put(const py::handle& tensor) {
    std::unique_lock<std::mutex> own = claim();
    started_ = tensor_arg(tensor, /*writable=*/false);  // its memory is held until wait()
    start([this] {
      return writer().put(TensorView{started_.spec, {started_.data, started_.size}});
    });
  }

  // The next tensor, `spec` (name, dtype, shape), written by producer(offset, address,
  // nbytes) itself: bytes [offset, +nbytes) of the tensor to host memory [address, +nbytes),
  // or only started there (a device's copy), completed by the update's flush. Runs in the
  // update's own thread, which takes the GIL only to call the producer; wait() as start_put.
  void start_produce(const py::sequence& spec, const py::function& producer) {
    std::unique_lock<std::mutex> own = claim();
    if (flush_.is_none()) {
      throw StatusError(invalid_argument("start_produce: the update was begun without a flush"));
    }
    std::vector<TensorSpec> one = specs_from_python(py::make_tuple(spec));
    produced_spec_ = std::move(one.front());
    producer_ = producer;  // held until wait()
    start([this] {
      const sync::TensorProducer produce = [this](std::uint64_t offset, std::span<std::byte> dst) {
        return bridge_.call(
            [&] { producer_(offset, reinterpret_cast<std::uintptr_t>(dst.data()), dst.size()); },
            "the sender's producer");
      };
      return writer().put(produced_spec_, produce);
    });
  }

  // Waits up to `timeout` seconds (None: no limit) for the started put: True once it is
  // done (raising its error, if any), False if it is still copying or waiting for a slot.
  bool wait(std::optional<double> timeout) {
    Status result;
    {
      py::gil_scoped_release nogil;
      std::unique_lock<std::mutex> lock(job_mutex_);
      const auto done = [&] { return done_ || job_ == nullptr; };
      if (!timeout) {
        job_changed_.wait(lock, done);
      } else if (!job_changed_.wait_for(lock, std::chrono::duration<double>(*timeout), done)) {
        return false;
      }
      result = job_status_;
    }
    started_ = TensorArg{};  // with the GIL: its buffer and producer are released
    producer_ = py::none();
    putting_ = false;
    for (PySender* end : ends_) end->interrupts_.raise_pending();
    bridge_.raise_saved();
    check(result);
    return true;
  }

  std::vector<sync::UpdateStats> finish() {
    return call([&](auto) { return writer().finish(); });
  }

  void abort(const std::string& why) {
    call([&](auto) {
      writer().abort(aborted(why));
      return ok_status();
    });
  }

 private:
  explicit PyUpdateWriter(const py::sequence& senders) {
    for (const py::handle& item : senders) {
      PySender* end = item.cast<PySender*>();
      if (std::find(ends_.begin(), ends_.end(), end) != ends_.end()) {
        throw StatusError(invalid_argument("send_update: a Sender is given twice"));
      }
      ends_.push_back(end);
      senders_.push_back(py::reinterpret_borrow<py::object>(item));
    }
  }

  sync::UpdateWriter& writer() { return *writer_; }

  // Hands `put` to the update's own thread. REQUIRES: claim()ed.
  void start(std::function<Status()> put) {
    if (!worker_.joinable()) worker_ = std::thread([this] { work(); });
    {
      std::lock_guard<std::mutex> lock(job_mutex_);
      job_ = std::move(put);
      done_ = false;
    }
    putting_ = true;
    job_changed_.notify_all();
  }

  // The update's own thread: runs each started put, taking the GIL only in a producer.
  void work() {
    std::unique_lock<std::mutex> lock(job_mutex_);
    for (;;) {
      job_changed_.wait(lock, [&] { return (job_ && !done_) || quit_; });
      if (quit_) return;
      lock.unlock();
      Status s = held([&](auto) { return job_(); });
      lock.lock();
      job_status_ = std::move(s);
      done_ = true;
      job_changed_.notify_all();
    }
  }

  std::vector<py::object> senders_;  // kept alive while the update is open
  std::vector<PySender*> ends_;
  CallbackBridge bridge_;                       // the producers' and flush()'s exceptions
  py::object flush_ = py::none();               // the update's flush(), if given
  std::unique_ptr<sync::UpdateWriter> writer_;  // after flush_: its options call it
  std::mutex mutex_;                            // one Python call at a time
  bool putting_ = false;      // start_put() was not yet followed by a wait() that saw it done
  TensorArg started_;         // the started put's tensor
  TensorSpec produced_spec_;  // or the started produce's spec
  py::object producer_ = py::none();  // and producer

  // The started put, between the Python thread and the update's own thread.
  std::thread worker_;
  std::mutex job_mutex_;
  std::condition_variable job_changed_;
  std::function<Status()> job_;  // the started put
  bool done_ = false;            // it is done: job_status_ says how
  bool quit_ = false;
  Status job_status_;
};

// What a Receiver and a MultiReceiver share: destinations (their buffers kept alive) and the
// destination and per-tensor rounds, which both C++ classes offer with one signature.
template <typename Impl>
class Receiving : public Endpoint<Impl> {
 public:
  void set_destination(const py::handle& tensor) {
    UseGuard use(this->mutex_, this->what_);
    Impl& r = this->get();
    TensorArg a = tensor_arg(tensor, /*writable=*/true);
    const std::string name = a.spec.name;
    check(r.set_destination({std::move(a.spec), {a.data, a.size}}));
    if (a.hold) {
      holds_.insert_or_assign(name, std::move(a.hold));
    } else {
      holds_.erase(name);
    }
  }

  // A rank-local destination: `tensor` (slice.local's dtype and shape) takes slice's bytes.
  void set_destination_slice(const TensorSlice& slice, const py::handle& tensor) {
    UseGuard use(this->mutex_, this->what_);
    Impl& r = this->get();
    TensorArg a = tensor_arg(tensor, /*writable=*/true);
    if (a.spec.dtype != slice.local.dtype || a.spec.shape != slice.local.shape) {
      throw StatusError(invalid_argument(
          fmt::format("destination for the slice of '{}': the tensor is {} {}, the slice {} {}",
                      slice.whole.name, a.spec.shape_string(), dtype_name(a.spec.dtype),
                      slice.local.shape_string(), dtype_name(slice.local.dtype))));
    }
    check(r.set_destination(slice, {a.data, a.size}));
    if (a.hold) {
      holds_.insert_or_assign(slice.whole.name, std::move(a.hold));
    } else {
      holds_.erase(slice.whole.name);
    }
  }

  void clear_destinations() {
    UseGuard use(this->mutex_, this->what_);
    this->get().clear_destinations();
    holds_.clear();
  }

  RoundStats receive_round_into() {
    UseGuard use(this->mutex_, this->what_);
    Impl& r = this->get();
    Result<RoundStats> result = [&] {
      py::gil_scoped_release nogil;
      return r.receive_round_into();
    }();
    this->interrupts_.raise_pending();
    return check(std::move(result));
  }

  // A MultiReceiver calls on_tensor from its senders' threads, one call at a time.
  RoundStats receive_round(const py::function& on_tensor) {
    UseGuard use(this->mutex_, this->what_);
    Impl& r = this->get();
    CallbackBridge bridge;
    const sync::TensorCallback cb = [&](const TensorView& v) {
      return bridge.call([&] { on_tensor(view_to_python(v)); });
    };
    Result<RoundStats> result = [&] {
      py::gil_scoped_release nogil;
      return r.receive_round(cb);
    }();
    this->interrupts_.raise_pending();
    return bridge.finish(std::move(result));
  }

  void close() {
    this->reset();
    holds_.clear();
  }

 protected:
  using Endpoint<Impl>::Endpoint;

 private:
  std::map<std::string, std::unique_ptr<BufferHold>> holds_;
};

class PyReceiver : public Receiving<sync::Receiver> {
 public:
  PyReceiver() : Receiving("receiver") {}
  static std::unique_ptr<PyReceiver> connect(const std::string& address, std::uint32_t id,
                                             const SyncOptions& o, std::uint64_t session) {
    auto r = std::make_unique<PyReceiver>();
    Result<std::unique_ptr<sync::Receiver>> c = [&] {
      py::gil_scoped_release nogil;
      return sync::Receiver::connect(address, id, with_interrupts(o, r->interrupts_), session);
    }();
    r->interrupts_.raise_pending();  // Ctrl-C while waiting for the sender: KeyboardInterrupt
    r->impl_ = check(std::move(c));
    return r;
  }

  void set_min_step(std::uint64_t step) {
    UseGuard use(mutex_, what_);
    get().set_min_step(step);
  }

  RoundStats receive_round_buckets(const py::function& on_bucket) {
    UseGuard use(mutex_, what_);
    sync::Receiver& r = get();
    CallbackBridge bridge;
    const sync::BucketCallback cb = [&](std::span<const TensorView> views, bool is_last) {
      return bridge.call([&] {
        py::list weights(views.size());
        for (std::size_t i = 0; i < views.size(); ++i) weights[i] = view_to_python(views[i]);
        on_bucket(weights, is_last);
      });
    };
    Result<RoundStats> result = [&] {
      py::gil_scoped_release nogil;
      return r.receive_round_buckets(cb);
    }();
    interrupts_.raise_pending();
    return bridge.finish(std::move(result));
  }

  // on_bucket(tensors, is_last, round_ends) with (name, dtype, shape, writable memoryview)
  // tensors, valid until the callback for the round's next bucket returns (include/ferry/
  // sync.h's WritableBucketCallback).
  RoundStats receive_round_buckets_writable(const py::function& on_bucket) {
    UseGuard use(mutex_, what_);
    sync::Receiver& r = get();
    CallbackBridge bridge;
    const sync::WritableBucketCallback cb = [&](std::span<const MutableTensorView> views,
                                                bool is_last, bool round_ends) {
      return bridge.call([&] { on_bucket(writable_list(views), is_last, round_ends); });
    };
    Result<RoundStats> result = [&] {
      py::gil_scoped_release nogil;
      return r.receive_round_buckets_writable(cb);
    }();
    interrupts_.raise_pending();
    return bridge.finish(std::move(result));
  }

  // on_segment(tensors, bucket_ends, is_last, round_ends) per segment that completes a tensor
  // and per bucket's last segment, with the writable mode's tensors and lifetimes (include/
  // ferry/sync.h's WritableSegmentCallback).
  RoundStats receive_round_segments_writable(const py::function& on_segment) {
    UseGuard use(mutex_, what_);
    sync::Receiver& r = get();
    CallbackBridge bridge;
    const sync::WritableSegmentCallback cb = [&](const sync::WritableSegment& segment) {
      return bridge.call([&] {
        on_segment(writable_list(segment.tensors), segment.bucket_ends, segment.is_last,
                   segment.round_ends);
      });
    };
    Result<RoundStats> result = [&] {
      py::gil_scoped_release nogil;
      return r.receive_round_segments_writable(cb);
    }();
    interrupts_.raise_pending();
    return bridge.finish(std::move(result));
  }

  // The pull form (sync::Receiver::begin_round and next_segment), which ferry.sync's
  // receive_update drives, one call per segment, from an executor thread under asyncio.
  // Returns (round, more_follows, step).
  py::tuple begin_round(const std::string& mode) {
    UseGuard use(mutex_, what_);
    sync::Receiver& r = get();
    sync::ReadInto into = sync::ReadInto::kViews;
    if (mode == "writable") {
      into = sync::ReadInto::kWritableViews;
    } else if (mode != "views") {
      throw StatusError(invalid_argument(
          fmt::format("begin_round: mode '{}': expected views or writable", mode)));
    }
    Result<sync::RoundBegin> begin = heeding_abort(r, [&] { return r.begin_round(into); });
    interrupts_.raise_pending();
    check(begin.status());
    writable_ = into == sync::ReadInto::kWritableViews;
    return py::make_tuple(begin->round, begin->more_follows, begin->step);
  }

  // None once the round's END matched (acknowledged: round_stats()); else (bucket, tensors,
  // bucket_ends, round_ends, is_last), the tensors (name, dtype, shape, memoryview) valid
  // until release(bucket).
  py::object next_segment() {
    UseGuard use(mutex_, what_);
    sync::Receiver& r = get();
    Result<std::optional<sync::ReadSegment>> got =
        heeding_abort(r, [&] { return r.next_segment(); });
    interrupts_.raise_pending();
    check(got.status());
    if (!*got) return py::none();
    const sync::ReadSegment& s = **got;
    py::list tensors;
    if (writable_) {
      tensors = writable_list(s.writable);
    } else {
      for (const TensorView& v : s.tensors) tensors.append(view_to_python(v));
    }
    return py::make_tuple(s.bucket, std::move(tensors), s.bucket_ends, s.round_ends, s.is_last);
  }

  void release(std::uint32_t bucket) {
    UseGuard use(mutex_, what_);
    sync::Receiver& r = get();
    check(heeding_abort(r, [&] { return r.release(bucket); }));
  }

  // From any thread: breaks the session with `why` (the sender's round fails naming it). A
  // call in flight in another thread ends within about 100 ms, failing with it; one that
  // returns first breaks the session before it returns (heeding_abort).
  void abort(const std::string& why) {
    interrupts_.stop(why);
    std::unique_lock<std::mutex> own(mutex_, std::try_to_lock);
    if (!own.owns_lock() || !impl_) return;  // the call in flight fails with `why`
    py::gil_scoped_release nogil;
    (void)impl_->abort(aborted(why));  // the reason as the sender hears it: not needed here
  }

  RoundStats round_stats() const { return get().round_stats(); }

  // None when receive_round_buckets_writable can run, else why not.
  py::tuple ring_memory() const {
    const std::span<const std::byte> ring = get().ring_memory();
    return py::make_tuple(reinterpret_cast<std::uintptr_t>(ring.data()), ring.size());
  }

  std::optional<std::string> writable_views_error() {
    UseGuard use(mutex_, what_);
    const Status s = get().writable_views_error();
    if (s.ok()) return std::nullopt;
    return s.to_string();
  }

 private:
  // (name, dtype, shape, writable memoryview) per view. REQUIRES: the GIL.
  static py::list writable_list(std::span<const MutableTensorView> views) {
    py::list weights(views.size());
    for (std::size_t i = 0; i < views.size(); ++i) {
      const MutableTensorView& v = views[i];
      weights[i] =
          py::make_tuple(v.spec.name, v.spec.dtype, py::tuple(py::cast(v.spec.shape)),
                         py::memoryview::from_memory(static_cast<void*>(v.data.data()),
                                                     static_cast<py::ssize_t>(v.data.size())));
    }
    return weights;
  }

  // Runs a pull call with the GIL released, heeding abort() from another thread: one that
  // came before the call fails it, and one that came while the call held the receiver (its
  // waits see it within about 100 ms, but a call that is not waiting does not) breaks the
  // session before the call returns, failing it too. abort() sets the reason before it tries
  // the receiver, and this checks it while holding the receiver, so none is missed.
  template <typename F>
  auto heeding_abort(sync::Receiver& r, F&& call) -> decltype(call()) {
    py::gil_scoped_release nogil;
    if (const auto why = interrupts_.stopped()) return r.abort(aborted(*why));
    auto result = call();
    if (const auto why = interrupts_.stopped(); why && result.ok()) return r.abort(aborted(*why));
    return result;
  }

  bool writable_ = false;  // the pulled round's views are writable
};

// A node's relay (sync::Relay). Usually run in a background thread: stop() may be called
// from any thread and ends the relay's waits for local receivers and, in a round, for its
// peers within about 100 ms (SyncOptions::interrupt). Between rounds the relay waits on
// its upstream only, so it ends there when the sender's session ends.
class PyRelay : public Endpoint<sync::Relay> {
 public:
  PyRelay() : Endpoint("relay") {}
  // The session ends before stopping_ (which its hook reads) is destroyed.
  ~PyRelay() {
    stop();
    impl_.reset();
  }
  PyRelay(const PyRelay&) = delete;
  PyRelay& operator=(const PyRelay&) = delete;
  static std::unique_ptr<PyRelay> connect(const std::string& upstream, std::uint32_t relay_id,
                                          const std::string& local_address, const SyncOptions& o,
                                          const std::string& relays_address) {
    auto r = std::make_unique<PyRelay>();
    SyncOptions options = o;
    options.interrupt = r->hook();
    Result<std::unique_ptr<sync::Relay>> c = [&] {
      py::gil_scoped_release nogil;
      return sync::Relay::connect(upstream, relay_id, local_address, options, relays_address);
    }();
    r->interrupts_.raise_pending();
    r->impl_ = check(std::move(c));
    return r;
  }

  void accept(std::uint32_t local_receivers, std::uint32_t downstream_relays) {
    UseGuard use(mutex_, what_);
    sync::Relay& r = get();
    Status st = [&] {
      py::gil_scoped_release nogil;
      return r.accept(local_receivers, downstream_relays);
    }();
    interrupts_.raise_pending();
    check(st);
  }

  RoundStats relay_round() {
    UseGuard use(mutex_, what_);
    sync::Relay& r = get();
    Result<RoundStats> result = [&] {
      py::gil_scoped_release nogil;
      return r.relay_round();
    }();
    interrupts_.raise_pending();
    return check(std::move(result));
  }

  void stop() { stopping_.store(true); }

  void close() {
    stop();
    reset();
  }

 private:
  // stop() first, without the GIL; then Ctrl-C, which Python hears in its main thread only.
  std::function<Status()> hook() {
    return [this, signals = interrupts_.hook()]() -> Status {
      if (stopping_.load()) return aborted("the relay was stopped");
      return signals();
    };
  }

  std::atomic<bool> stopping_{false};
};

// One round from several senders, each sending a disjoint part (include/ferry/multi_receiver.h).
class PyMultiReceiver : public Receiving<sync::MultiReceiver> {
 public:
  PyMultiReceiver() : Receiving("multi-receiver") {}
  static std::unique_ptr<PyMultiReceiver> connect(const std::vector<std::string>& addresses,
                                                  std::uint32_t id, const SyncOptions& o) {
    auto r = std::make_unique<PyMultiReceiver>();
    Result<std::unique_ptr<sync::MultiReceiver>> c = [&] {
      py::gil_scoped_release nogil;
      return sync::MultiReceiver::connect(addresses, id, with_interrupts(o, r->interrupts_));
    }();
    r->interrupts_.raise_pending();
    r->impl_ = check(std::move(c));
    return r;
  }

  std::vector<RoundStats> sender_stats() const {
    const std::span<const RoundStats> s = get().sender_stats();
    return {s.begin(), s.end()};
  }

  // on_tensor from the senders' threads, one call at a time, as receive_round's.
  RoundStats receive_update(const py::function& on_tensor) {
    UseGuard use(mutex_, what_);
    sync::MultiReceiver& r = get();
    CallbackBridge bridge;
    const sync::TensorCallback cb = [&](const TensorView& v) {
      return bridge.call([&] { on_tensor(view_to_python(v)); });
    };
    Result<RoundStats> result = [&] {
      py::gil_scoped_release nogil;
      return r.receive_update(cb);
    }();
    interrupts_.raise_pending();
    return bridge.finish(std::move(result));
  }

  void set_min_step(std::uint64_t step) {
    UseGuard use(mutex_, what_);
    get().set_min_step(step);
  }
};

std::vector<std::vector<std::size_t>> split_into_parts(const py::sequence& specs,
                                                       std::uint32_t parts) {
  const std::vector<TensorSpec> manifest = specs_from_python(specs);
  return check(sync::split_into_parts(manifest, parts));
}

}  // namespace

void bind_sync(py::module_& m) {
  // Made from ferry/sync_option_fields.h's tables: a field added there is a keyword, a
  // property and part of the repr here without another line.
  py::class_<SyncOptions> options(
      m, "SyncOptions",
      "How a Sender, Receiver or Relay runs its session (include/ferry/sync.h's "
      "SyncOptions: SessionOptions, SenderOptions and ReceiverOptions); times in seconds, -1 "
      "waits forever. sync_option_fields() lists the fields by role.");
  def_options_init(options,
                   std::make_index_sequence<std::tuple_size_v<decltype(kBoundOptionFields)>>());
  std::apply([&](const auto&... field) { (def_option_property(options, field), ...); },
             kBoundOptionFields);
  options.def("__repr__", &options_repr);
  m.def(
      "sync_option_fields",
      [] {
        py::list fields;
        sync::for_each_option_field([&](std::string_view role, const auto& field) {
          fields.append(
              py::make_tuple(field.name, role, sync::option_kind_name(field.kind), field.doc));
        });
        return py::tuple(fields);
      },
      "Every SyncOptions field as (name, role, kind, doc), role 'session', 'sender' or "
      "'receiver' (include/ferry/sync_option_fields.h); kind 'not bound' is C++ only.");

  py::class_<RoundStats>(m, "RoundStats", "What one sent, received or relayed round carried.")
      .def_readonly("round", &RoundStats::round, "The round's number in its session, from 1.")
      .def_readonly("tensors", &RoundStats::tensors, "Tensors in the round.")
      .def_readonly("buckets", &RoundStats::buckets, "Buckets the round took.")
      .def_readonly("bytes", &RoundStats::bytes, "Tensor bytes in the round.")
      .def_readonly("delivered_bytes", &RoundStats::delivered_bytes,
                    "Bytes this receiver copied out: `bytes`, or only its slices' bytes when its "
                    "destinations are rank-local slices (ferry.vllm_tp_slices).")
      .def_readonly("seconds", &RoundStats::seconds, "Wall time of the round.")
      .def_readonly("checksum", &RoundStats::checksum,
                    "The round checksum sender and receivers agreed on.")
      .def_readonly("more_follows", &RoundStats::more_follows,
                    "True when the sender said more rounds of this update follow.")
      .def_readonly("delta", &RoundStats::delta,
                    "True when the round was a delta round (only what changed travelled).")
      .def_readonly("wire_bytes", &RoundStats::wire_bytes,
                    "Bytes the round carried: the encoded deltas, or the tensor bytes when dense.")
      .def_readonly("base_version", &RoundStats::base_version,
                    "The version a delta round was encoded against (0 for a dense round).")
      .def_readonly("version", &RoundStats::version,
                    "The version the receivers hold after this round.")
      .def_readonly("step", &RoundStats::step,
                    "The trainer's step the sender gave this round (its `step=`, e.g. verl's "
                    "global_steps), or None when it gave none.")
      .def("__repr__", [](const RoundStats& s) {
        return fmt::format(
            "RoundStats(round={}, tensors={}, buckets={}, bytes={}, delivered_bytes={}, "
            "seconds={:.6f}, checksum=0x{:016x}, more_follows={}, delta={}, wire_bytes={}, "
            "step={})",
            s.round, s.tensors, s.buckets, s.bytes, s.delivered_bytes, s.seconds, s.checksum,
            s.more_follows ? "True" : "False", s.delta ? "True" : "False", s.wire_bytes,
            s.step ? std::to_string(*s.step) : "None");
      });

  py::class_<sync::UpdateStats>(m, "UpdateStats",
                                "What one update (send_update) sent to one Sender's receivers.")
      .def_readonly("bytes", &sync::UpdateStats::bytes, "Tensor bytes of the update.")
      .def_readonly("tensors", &sync::UpdateStats::tensors, "Tensors of the update.")
      .def_readonly("rounds", &sync::UpdateStats::rounds, "Rounds the update took.")
      .def_readonly("streamed", &sync::UpdateStats::streamed,
                    "True when it streamed in one round against the last update's manifest; "
                    "False when it was staged.")
      .def_readonly("seconds", &sync::UpdateStats::seconds, "Its rounds' seconds, added up.")
      .def_readonly("last_round", &sync::UpdateStats::last_round,
                    "The RoundStats of its last round (a streamed update's only one).")
      .def("__repr__", [](const sync::UpdateStats& s) {
        return fmt::format(
            "UpdateStats(bytes={}, tensors={}, rounds={}, streamed={}, "
            "seconds={:.6f})",
            s.bytes, s.tensors, s.rounds, s.streamed ? "True" : "False", s.seconds);
      });
  py::class_<PyUpdateWriter>(
      m, "UpdateWriter",
      "One update pushed a tensor at a time (use ferry.sync.send_update or send_update_async).")
      .def_static("update", &PyUpdateWriter::update, py::arg("senders"),
                  py::arg("step") = py::none(),
                  py::arg("staging_bytes") = sync::UpdateOptions{}.staging_bytes,
                  py::arg("flush") = py::none(),
                  "An update to every Sender of `senders`: streamed against the last update's "
                  "manifest, or staged, as its first tensor decides. flush() completes the "
                  "copies start_produce's producers started (needed by start_produce).")
      .def_static("round", &PyUpdateWriter::round, py::arg("sender"), py::arg("specs"),
                  py::arg("more_follows") = false, py::arg("step") = py::none(),
                  "One round to `sender` streamed against `specs` (name, dtype, shape); BEGIN "
                  "goes out now.")
      .def("put", &PyUpdateWriter::put, py::arg("tensor"),
           "The next tensor, (name, dtype, shape, address, nbytes) or (name, dtype, shape, "
           "buffer), copied before this returns; may wait for a free slot.")
      .def("start_put", &PyUpdateWriter::start_put, py::arg("tensor"),
           "put() in the update's own thread, without the GIL: returns at once; the tensor's "
           "memory must stay unchanged until wait() returned True.")
      .def("start_produce", &PyUpdateWriter::start_produce, py::arg("spec"), py::arg("producer"),
           "The next tensor, spec (name, dtype, shape), written by producer(offset, address, "
           "nbytes) into host memory itself (or started there, completed by flush()), in the "
           "update's own thread with the GIL taken for the call; then wait() as for start_put.")
      .def("wait", &PyUpdateWriter::wait, py::arg("timeout") = py::none(),
           "Waits up to `timeout` s (None: no limit) for the started put: True once it is done "
           "(raising its error), False while it still copies or waits for a slot.")
      .def("finish", &PyUpdateWriter::finish,
           "Sends the rest and waits for every receiver's acknowledgement: one UpdateStats per "
           "Sender.")
      .def("abort", &PyUpdateWriter::abort, py::arg("why"),
           "Ends the update with `why` (the receivers hear it if any of it went out); no-op "
           "once it ended.");

  py::class_<PySender>(m, "Sender", "The trainer's end of a session (use ferry.Sender).")
      .def_static("create", &PySender::create, py::arg("address"), py::arg("options"),
                  "Binds `address` ('@name', a socket path or 'host:port') and creates the ring.")
      .def("accept", &PySender::accept, py::arg("receivers"),
           "Waits for `receivers` more receivers to join, each within options.timeout.")
      .def("send_round", &PySender::send_round, py::arg("weights"), py::arg("more_follows") = false,
           py::arg("step") = py::none(),
           "Sends one round of (name, dtype, shape, address, nbytes) or (name, dtype, shape, "
           "buffer) tensors to every receiver; `step` (the trainer's, e.g. verl's global_steps) "
           "travels with it and is every receiver's RoundStats.step.")
      .def("ring_memory", &PySender::ring_memory,
           "The ring as (address, nbytes), valid until close(): for page-locking it with a "
           "device once (send_update's device copies land in it).")
      .def("close", &PySender::close, "Ends the session; the receivers are told.")
      .def_property_readonly("closed", &PySender::closed, "True once close() ran.")
      .def_property_readonly(
          "session_id", [](const PySender& s) { return s.get().session_id(); },
          "The current session's id.")
      .def_property_readonly(
          "update_manifest",
          [](const PySender& s) -> py::object {
            const auto& learned = s.get().update_manifest();
            if (!learned) return py::none();
            py::list out;
            for (const TensorSpec& t : *learned) {
              py::tuple shape(t.shape.size());
              for (std::size_t i = 0; i < t.shape.size(); ++i) shape[i] = t.shape[i];
              out.append(py::make_tuple(t.name, t.dtype, std::move(shape)));
            }
            return out;
          },
          "The manifest send_update streams the next update against, as (name, dtype, shape) "
          "tuples; None before an update was sent whole with unique names and after a failed "
          "round.")
      .def_property_readonly(
          "rounds_sent", [](const PySender& s) { return s.get().rounds_sent(); },
          "Rounds sent in the current session.")
      .def_property_readonly(
          "receivers", [](const PySender& s) { return s.get().receivers(); },
          "Receivers in the current session.")
      .def_property_readonly(
          "address", [](const PySender& s) { return s.get().address(); },
          "The address receivers connect to.");

  py::class_<PyReceiver>(m, "Receiver", "A rollout's end of a session (use ferry.Receiver).")
      .def_static("connect", &PyReceiver::connect, py::arg("address"), py::arg("receiver_id"),
                  py::arg("options"), py::arg("session") = 0,
                  "Joins the sender at `address` as `receiver_id`; session 0 takes any session.")
      .def("set_destination", &PyReceiver::set_destination, py::arg("tensor"),
           "Makes receive_round_into() write the named tensor into this writable memory.")
      .def("set_destination_slice", &PyReceiver::set_destination_slice, py::arg("slice"),
           py::arg("tensor"),
           "Makes receive_round_into() write only `slice`'s bytes of its tensor into this "
           "writable memory (the slice's local shape).")
      .def("clear_destinations", &PyReceiver::clear_destinations,
           "Forgets every destination set_destination() gave.")
      .def("set_min_step", &PyReceiver::set_min_step, py::arg("step"),
           "Refuses every later round whose step is below `step` (FailedPreconditionError at "
           "its BEGIN, before any tensor is delivered; the sender's round fails with it). The "
           "receiver raises this minimum to each step it receives; rounds without a step pass.")
      .def("receive_round_into", &PyReceiver::receive_round_into,
           "Receives one round into the destinations; every tensor needs one.")
      .def("receive_round", &PyReceiver::receive_round, py::arg("on_tensor"),
           "Receives one round, calling on_tensor((name, dtype, shape, memoryview)) per tensor; "
           "the view is valid only during the call.")
      .def("receive_round_buckets", &PyReceiver::receive_round_buckets, py::arg("on_bucket"),
           "Receives one round, calling on_bucket(tensors, is_last) per bucket.")
      .def("receive_round_buckets_writable", &PyReceiver::receive_round_buckets_writable,
           py::arg("on_bucket"),
           "Receives one round, calling on_bucket(tensors, is_last, round_ends) per bucket "
           "with writable copy-on-write views, valid until the callback for the round's next "
           "bucket returns.")
      .def("ring_memory", &PyReceiver::ring_memory,
           "The ring as (address, nbytes), read-only: for page-locking it with a device once.")
      .def("receive_round_segments_writable", &PyReceiver::receive_round_segments_writable,
           py::arg("on_segment"),
           "Receives one round, calling on_segment(tensors, bucket_ends, is_last, round_ends) "
           "per segment that completes a tensor and per bucket's last segment, with the views "
           "and lifetimes of receive_round_buckets_writable.")
      .def("begin_round", &PyReceiver::begin_round, py::arg("mode") = "views",
           "Waits for the next round's BEGIN (the pull form): (round, more_follows, step). "
           "mode 'views' (read-only) or 'writable' (copy-on-write views of the ring).")
      .def("next_segment", &PyReceiver::next_segment,
           "The round's next verified segment, (bucket, tensors, bucket_ends, round_ends, "
           "is_last), or None once its END was verified and acknowledged. A bucket's tensors "
           "are valid until release(bucket).")
      .def("release", &PyReceiver::release, py::arg("bucket"),
           "Hands a bucket's ring slot back to the sender, in bucket order; its tensors end.")
      .def("abort", &PyReceiver::abort, py::arg("why"),
           "From any thread: breaks the session with `why`; the sender's round fails naming "
           "it, and a call in flight in another thread raises it within about 100 ms.")
      .def_property_readonly(
          "ring_slots", [](const PyReceiver& r) { return r.get().ring_slots(); },
          "The sender's ring slots (buckets in flight).")
      .def("round_stats", &PyReceiver::round_stats,
           "The RoundStats of the last round pulled to its end.")
      .def("writable_views_error", &PyReceiver::writable_views_error,
           "None when receive_round_buckets_writable can run, else the reason it cannot.")
      .def("close", &PyReceiver::close, "Leaves the session.")
      .def_property_readonly("closed", &PyReceiver::closed, "True once close() ran.")
      .def_property_readonly(
          "session_id", [](const PyReceiver& r) { return r.get().session_id(); },
          "The session's id.")
      .def_property_readonly(
          "last_round", [](const PyReceiver& r) { return r.get().last_round(); },
          "The number of the last round received.");

  py::class_<PyMultiReceiver>(m, "MultiReceiver",
                              "A rollout's end of several senders' sessions (use "
                              "ferry.MultiReceiver).")
      .def_static("connect", &PyMultiReceiver::connect, py::arg("addresses"),
                  py::arg("receiver_id"), py::arg("options"),
                  "Joins the sender at each address as `receiver_id`.")
      .def("set_destination", &PyMultiReceiver::set_destination, py::arg("tensor"),
           "Makes receive_round_into() write the named tensor, whichever sender sends it, into "
           "this writable memory.")
      .def("set_destination_slice", &PyMultiReceiver::set_destination_slice, py::arg("slice"),
           py::arg("tensor"),
           "Makes receive_round_into() write only `slice`'s bytes of its tensor, whichever "
           "sender sends it, into this writable memory (the slice's local shape).")
      .def("clear_destinations", &PyMultiReceiver::clear_destinations,
           "Forgets every destination set_destination() gave.")
      .def("receive_round_into", &PyMultiReceiver::receive_round_into,
           "Receives one round from every sender into the destinations.")
      .def("receive_round", &PyMultiReceiver::receive_round, py::arg("on_tensor"),
           "Receives one round from every sender, calling on_tensor((name, dtype, shape, "
           "memoryview)) per tensor, one call at a time; the view is valid only during the call.")
      .def("receive_update", &PyMultiReceiver::receive_update, py::arg("on_tensor"),
           "Receives one whole update from every sender (each sender's rounds until one says "
           "no more follow), calling on_tensor((name, dtype, shape, memoryview)) per tensor, "
           "one call at a time; the view is valid only during the call.")
      .def("set_min_step", &PyMultiReceiver::set_min_step, py::arg("step"),
           "Refuses every later round whose step is below `step`, in every sender's session "
           "(FailedPreconditionError at its BEGIN, before any tensor is delivered).")
      .def("sender_stats", &PyMultiReceiver::sender_stats,
           "Each sender's RoundStats of the last round that succeeded, in address order.")
      .def("close", &PyMultiReceiver::close, "Leaves every session.")
      .def_property_readonly("closed", &PyMultiReceiver::closed, "True once close() ran.")
      .def_property_readonly(
          "addresses", [](const PyMultiReceiver& r) { return r.get().addresses(); },
          "The senders' addresses, in the order given.");
  m.def("split_into_parts", &split_into_parts, py::arg("specs"), py::arg("parts"),
        "Splits (name, dtype, shape) specs into `parts` disjoint parts of about equal bytes, "
        "the same on every rank: each part's spec indices, in the order given.");

  py::class_<PyRelay>(m, "Relay",
                      "A node's relay: one network copy from upstream, fanned out over shared "
                      "memory (use ferry.Relay).")
      .def_static("connect", &PyRelay::connect, py::arg("upstream"), py::arg("relay_id"),
                  py::arg("local_address"), py::arg("options"), py::arg("relays_address") = "",
                  "Joins the sender (or upstream relay) at `upstream` and serves this node at "
                  "`local_address`, and downstream relays at `relays_address` if given.")
      .def("accept", &PyRelay::accept, py::arg("local_receivers"), py::arg("downstream_relays") = 0,
           "Waits for `local_receivers` receivers on this node, then `downstream_relays` "
           "relays, to join.")
      .def("relay_round", &PyRelay::relay_round,
           "Passes one round from upstream to the local receivers.")
      .def("stop", &PyRelay::stop,
           "Ends the relay's waits within about 100 ms; callable from any thread.")
      .def("close", &PyRelay::close, "Stops the relay and leaves the session.")
      .def_property_readonly("closed", &PyRelay::closed, "True once close() ran.")
      .def_property_readonly(
          "session_id", [](const PyRelay& r) { return r.get().session_id(); }, "The session's id.")
      .def_property_readonly(
          "local_address", [](const PyRelay& r) { return r.get().local_address(); },
          "The address this node's receivers connect to.")
      .def_property_readonly(
          "relays_address", [](const PyRelay& r) { return r.get().relays_address(); },
          "Where downstream relays connect (\"host:port\", the port picked for a port 0); "
          "'' when none are served.");
}

}  // namespace ferry::python
