// serve_replicas() on a thread of its own, for the replicate tests: listening once
// constructed (address() is "" when it could not bind), stopped and joined when destroyed.
#pragma once

#include <atomic>
#include <future>
#include <string>
#include <thread>

#include "ferry/megatron.h"
#include "ferry/status.h"

namespace ferry::checkpoint {

class ServerThread {
 public:
  explicit ServerThread(ReplicateServeOptions o) {
    std::promise<std::string> bound;
    auto address = bound.get_future();
    o.stop = [this] { return stop_.load(); };
    o.on_listening = [&bound](const std::string& a) { bound.set_value(a); };
    thread_ = std::thread([this, o = std::move(o), bound = &bound]() mutable {
      status_ = serve_replicas(o);
      if (!status_.ok()) bound->set_value("");  // bind failed: no address
    });
    address_ = address.get();
  }
  ~ServerThread() { stop(); }
  ServerThread(const ServerThread&) = delete;
  ServerThread& operator=(const ServerThread&) = delete;

  const Status& stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
    return status_;
  }
  const std::string& address() const { return address_; }

 private:
  std::atomic<bool> stop_{false};
  std::string address_;
  Status status_;
  std::thread thread_;
};

}  // namespace ferry::checkpoint
