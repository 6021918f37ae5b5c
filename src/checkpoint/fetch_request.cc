#include "checkpoint/fetch_request.h"

#include <nlohmann/json.hpp>

#include "base/status_macros.h"

namespace ferry::checkpoint {

using json = nlohmann::json;

std::string encode_fetch_request(const FetchRequest& r) {
  if (r.op == FetchRequest::Op::kManifest) return json{{"op", "manifest"}, {"step", r.step}}.dump();
  json ahead = json::array();
  for (const auto& [tensor, slice] : r.ahead) ahead.push_back({tensor, slice});
  return json{{"op", "slice"},
              {"step", r.step},
              {"tensor", r.tensor},
              {"slice", r.slice},
              {"offset", r.region.offset},
              {"extent", r.region.extent},
              {"ahead", ahead}}
      .dump();
}

Result<FetchRequest> decode_fetch_request(std::string_view text, std::string_view from) {
  const std::string who = "fetch request from " + std::string(from);
  const json q = json::parse(text, nullptr, false);
  if (q.is_discarded() || !q.is_object()) return corruption(who + " is not a JSON object");
  auto bad = [&](std::string_view field, std::string_view want) {
    return corruption(who + ": '" + std::string(field) + "' must be " + std::string(want));
  };
  FetchRequest r;
  auto op = q.find("op");
  if (op == q.end() || !op->is_string()) return bad("op", "\"manifest\" or \"slice\"");
  if (*op == "manifest")
    r.op = FetchRequest::Op::kManifest;
  else if (*op == "slice")
    r.op = FetchRequest::Op::kSlice;
  else
    return bad("op", "\"manifest\" or \"slice\"");
  auto step = q.find("step");
  if (step == q.end() || !step->is_number_integer()) return bad("step", "an integer");
  r.step = step->get<std::int64_t>();
  if (r.op == FetchRequest::Op::kManifest) return r;

  auto tensor = q.find("tensor");
  if (tensor == q.end() || !tensor->is_string()) return bad("tensor", "a string");
  r.tensor = tensor->get<std::string>();
  auto slice = q.find("slice");
  if (slice == q.end() || !slice->is_number_unsigned()) return bad("slice", "a slice index");
  r.slice = slice->get<std::size_t>();
  auto dims = [&](const char* field, std::vector<std::int64_t>* out) -> Status {
    auto v = q.find(field);
    if (v == q.end() || !v->is_array()) return bad(field, "an array of integers");
    for (const json& x : *v) {
      if (!x.is_number_integer()) return bad(field, "an array of integers");
      out->push_back(x.get<std::int64_t>());
    }
    return ok_status();
  };
  FERRY_RETURN_IF_ERROR(dims("offset", &r.region.offset));
  FERRY_RETURN_IF_ERROR(dims("extent", &r.region.extent));
  if (r.region.offset.size() != r.region.extent.size()) {
    return corruption(who + ": 'offset' and 'extent' have different lengths");
  }
  if (auto ahead = q.find("ahead"); ahead != q.end()) {
    if (!ahead->is_array() || ahead->size() > kMaxAheadHints) {
      return bad("ahead", "an array of at most " + std::to_string(kMaxAheadHints) +
                              " [tensor, slice] pairs");
    }
    for (const json& h : *ahead) {
      if (!h.is_array() || h.size() != 2 || !h[0].is_string() || !h[1].is_number_unsigned()) {
        return bad("ahead", "an array of [tensor, slice] pairs");
      }
      r.ahead.emplace_back(h[0].get<std::string>(), h[1].get<std::size_t>());
    }
  }
  return r;
}

}  // namespace ferry::checkpoint
