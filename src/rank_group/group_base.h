// What every RankGroup implementation shares: the membership check, how peers
// are named in errors, broadcast and barrier in terms of all_gather, fetch and
// fetch_into in terms of one fetch_impl, and the installed fetch handler.
#pragma once

#include <memory>
#include <shared_mutex>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/status_macros.h"
#include "rank_group/rank_group.h"

namespace ferry::rank_group {

using checkpoint::RankGroup;

class GroupBase : public RankGroup {
 public:
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::string& node() const override { return node_; }

  Result<std::string> broadcast(std::string_view data, int root) override {
    if (root < 0 || root >= size_) return invalid_argument("broadcast root outside the group");
    auto all = all_gather(rank_ == root ? data : std::string_view());
    if (!all.ok()) return all.status();
    return std::move((*all)[root]);
  }

  Status barrier() override { return all_gather("").status(); }

  Result<std::string> fetch(int peer, std::string_view request) override {
    if (peer < 0 || peer >= size_) return invalid_argument("fetch from a rank outside the group");
    std::string out;
    FERRY_RETURN_IF_ERROR(fetch_impl(peer, request, nullptr, &out));
    return out;
  }

  Status fetch_into(int peer, std::string_view request, std::span<std::byte> out) override {
    if (peer < 0 || peer >= size_) return invalid_argument("fetch from a rank outside the group");
    return fetch_impl(peer, request, &out, nullptr);
  }

  // Returns once no call of the previous handler is running.
  void set_fetch_handler(FetchHandler handler) override {
    std::unique_lock<std::shared_mutex> lock(handler_mu_);
    handler_ = std::move(handler);
  }

 protected:
  GroupBase(int rank, int size, std::string node)
      : rank_(rank), size_(size), node_(std::move(node)) {}

  // A valid node name and a rank inside the group.
  Status check_membership() const {
    FERRY_RETURN_IF_ERROR(validate_node_name(node_));
    if (size_ <= 0 || rank_ < 0 || rank_ >= size_) {
      return invalid_argument("rank " + std::to_string(rank_) + " is outside a group of " +
                              std::to_string(size_));
    }
    return ok_status();
  }

  // "rank 3 (node n1)"; the node is "?" until the member table is known.
  std::string peer_name(int r) const {
    const bool known = r >= 0 && static_cast<std::size_t>(r) < nodes_.size() && !nodes_[r].empty();
    return "rank " + std::to_string(r) + " (node " + (known ? nodes_[r] : "?") + ")";
  }

  // Sends `request` to `peer` (inside the group); the answer's payload goes to
  // `into`, which it must fill exactly, or to `text`.
  virtual Status fetch_impl(int peer, std::string_view request, std::span<std::byte>* into,
                            std::string* text) = 0;

  // The installed handler's answer to `from`; failed_precondition without one.
  // Handlers may run concurrently with each other, never with set_fetch_handler().
  Result<FetchReply> answer(int from, std::string_view request) {
    std::shared_lock<std::shared_mutex> lock(handler_mu_);
    if (!handler_) {
      return failed_precondition("rank " + std::to_string(rank_) + " is not serving fetches now");
    }
    return handler_(from, request);
  }

  std::vector<std::string> nodes_;  // node of each rank, once the group is joined

 private:
  const int rank_;
  const int size_;
  const std::string node_;
  std::shared_mutex handler_mu_;
  FetchHandler handler_;
};

}  // namespace ferry::rank_group
