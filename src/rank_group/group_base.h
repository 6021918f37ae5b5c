// The rank group apart from how its messages travel (group.cc): the membership check,
// how peers are named in errors, broadcast and barrier in terms of all_gather, fetch and
// fetch_into in terms of one fetch_impl, the installed fetch handler, and what the group
// checks of its messages (rank_group/messages.h).
#pragma once

#include <memory>
#include <shared_mutex>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/status_macros.h"
#include "rank_group/constants.h"
#include "rank_group/messages.h"
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
    std::string out;
    FERRY_RETURN_IF_ERROR(fetch_impl(peer, request, nullptr, &out));
    return out;
  }

  Status fetch_into(int peer, std::string_view request, std::span<std::byte> out) override {
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

  // Sends `request` to `peer` (invalid_argument outside the group); the answer's payload
  // goes to `into`, which it must fill exactly, or to `text`.
  virtual Status fetch_impl(int peer, std::string_view request, std::span<std::byte>* into,
                            std::string* text) = 0;

  // Rank 0: what is wrong with a JOIN from `who` ("rank 3 (peer ...)") to a group at
  // `root`: another version or group size, a rank outside the group or `taken` already, or
  // a bad node name. OK when nothing is.
  Status check_join(const msg::Join& join, const std::string& who, const std::string& root,
                    bool taken) const {
    if (join.version != kVersion) {
      return failed_precondition(who + " speaks checkpoint group protocol version " +
                                 std::to_string(join.version) + ", rank 0 version " +
                                 std::to_string(kVersion));
    }
    if (join.size != static_cast<std::uint32_t>(size_)) {
      return invalid_argument(who + " joined a group of " + std::to_string(join.size) +
                              " ranks, rank 0 one of " + std::to_string(size_));
    }
    if (join.rank == 0 || join.rank >= join.size || taken) {
      return invalid_argument(who + " joined " + root + " twice or is outside the group of " +
                              std::to_string(size_));
    }
    return validate_node_name(join.node).with_context(who);
  }

  // The failure rank 0 reports in ABORT message `m`.
  Status read_abort(std::span<const std::byte> m) const {
    auto why = msg::decode_abort(m);
    if (!why.ok()) return why.status().with_context(peer_name(0));
    return Status(why->code, why->message + " (reported by rank 0)");
  }

  // Fetcher: the ANSWER `m` to request `id` from `peer`, checked: its id and, when it is
  // OK, the size of the bytes that follow (at most kMaxPayloadBytes; `expected` unless that
  // is kAnySize). An error here leaves the connection out of step; an error answer does not.
  Result<msg::Answer> check_answer(std::span<const std::byte> m, std::uint32_t id, int peer,
                                   std::uint64_t expected) const {
    auto a = msg::decode_answer(m);
    if (!a.ok()) return a.status().with_context(peer_name(peer));
    if (a->id != id) {
      return corruption("malformed fetch answer from " + peer_name(peer) + ": id " +
                        std::to_string(a->id) + ", expected " + std::to_string(id));
    }
    if (a->code == Code::kOk && a->size > kMaxPayloadBytes) {
      return corruption(peer_name(peer) + " announced an answer of " + std::to_string(a->size) +
                        " bytes (at most " + std::to_string(kMaxPayloadBytes) + ")");
    }
    if (a->code == Code::kOk && expected != kAnySize && a->size != expected) {
      return corruption(peer_name(peer) + " answered " + std::to_string(a->size) +
                        " bytes, expected " + std::to_string(expected));
    }
    return a;
  }

  // Server: the rank a FETCH_HELLO `m` from `who` names (of this version, inside the group).
  Result<int> check_fetch_hello(std::span<const std::byte> m, const std::string& who) const {
    auto hello = msg::decode_fetch_hello(m);
    if (!hello.ok()) return hello.status().with_context(who);
    if (hello->version != kVersion || hello->rank >= static_cast<std::uint32_t>(size_)) {
      return corruption(who + ": a fetch hello of version " + std::to_string(hello->version) +
                        " from rank " + std::to_string(hello->rank) + " (this group: version " +
                        std::to_string(kVersion) + ", " + std::to_string(size_) + " ranks)");
    }
    return static_cast<int>(hello->rank);
  }

  // Server: the handler's answer to `fetch` from rank `from` (into *reply) and the ANSWER
  // that announces it, an error answer when the handler failed (failed_precondition when
  // none is installed) or its reply is not of the expected size. The reply's bytes follow
  // the ANSWER only when it is OK. Handlers may run concurrently with each other, never
  // with set_fetch_handler().
  std::vector<std::byte> answer_fetch(int from, const msg::Fetch& fetch, FetchReply* reply) {
    std::shared_lock<std::shared_mutex> lock(handler_mu_);
    Result<FetchReply> r =
        handler_
            ? handler_(from, fetch.request)
            : failed_precondition("rank " + std::to_string(rank_) + " is not serving fetches now");
    Status s = r.status();
    if (s.ok()) {
      *reply = std::move(*r);
      const std::uint64_t n = reply->bytes().size();
      if (fetch.expected != kAnySize && n != fetch.expected) {
        // Not peer_name(): the server's threads do not read nodes_.
        s = corruption("rank " + std::to_string(rank_) + " (node " + node_ + ") answered " +
                       std::to_string(n) + " bytes, expected " + std::to_string(fetch.expected));
      }
    }
    if (!s.ok()) *reply = FetchReply();
    std::vector<std::byte> head =
        msg::encode_answer({fetch.id, s.code(), reply->bytes().size(), s.message()});
    if (head.size() > transport::kMaxMessageBytes) head.resize(transport::kMaxMessageBytes);
    return head;
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
