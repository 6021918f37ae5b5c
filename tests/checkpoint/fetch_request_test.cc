// Fetch requests between loading ranks: what one encodes the other decodes, and a
// malformed one is a corruption error that names the sender and the field.
#include "checkpoint/fetch_request.h"

#include <gtest/gtest.h>

#include <string>

#include "support/status_matchers.h"

namespace ferry::checkpoint {
namespace {

TEST(FetchRequest, SliceAndManifestRequestsRoundTrip) {
  FetchRequest slice{.op = FetchRequest::Op::kSlice,
                     .step = 12,
                     .tensor = "model.layers.0.mlp.down_proj.weight",
                     .slice = 3,
                     .region = {{8, 0}, {4, 72}},
                     .ahead = {{"lm_head.weight", 1}, {"model.norm.weight", 0}}};
  auto back = decode_fetch_request(encode_fetch_request(slice), "rank 1");
  ASSERT_OK(back);
  EXPECT_EQ(*back, slice);

  FetchRequest manifest{.op = FetchRequest::Op::kManifest, .step = 7};
  back = decode_fetch_request(encode_fetch_request(manifest), "rank 1");
  ASSERT_OK(back);
  EXPECT_EQ(*back, manifest);
}

TEST(FetchRequest, MalformedRequestsNameTheSenderAndTheField) {
  const std::string slice = R"("op":"slice","step":1,"tensor":"t","slice":0,)";
  const struct {
    std::string text, field;
  } cases[] = {
      {"not json", "not a JSON object"},
      {"[1,2]", "not a JSON object"},
      {R"({"op":5,"step":1})", "'op'"},
      {R"({"op":"delete","step":1})", "'op'"},
      {R"({"op":"manifest"})", "'step'"},
      {R"({"op":"manifest","step":"1"})", "'step'"},
      {R"({"op":"slice","step":1,"tensor":3,"slice":0,"offset":[0],"extent":[1]})", "'tensor'"},
      {R"({"op":"slice","step":1,"tensor":"t","slice":"first","offset":[0],"extent":[1]})",
       "'slice'"},
      {R"({"op":"slice","step":1,"tensor":"t","slice":-1,"offset":[0],"extent":[1]})", "'slice'"},
      {"{" + slice + R"("offset":[0.5],"extent":[1]})", "'offset'"},
      {"{" + slice + R"("offset":[0]})", "'extent'"},
      {"{" + slice + R"("offset":[0,0],"extent":[1]})", "different lengths"},
      {"{" + slice + R"("offset":[0],"extent":[1],"ahead":{"t":0}})", "'ahead'"},
      {"{" + slice + R"("offset":[0],"extent":[1],"ahead":[["t"]]})", "'ahead'"},
  };
  for (const auto& c : cases) {
    auto r = decode_fetch_request(c.text, "rank 3");
    ASSERT_FALSE(r.ok()) << c.text;
    EXPECT_EQ(r.status().code(), Code::kCorruption) << c.text;
    EXPECT_NE(r.status().message().find("fetch request from rank 3"), std::string::npos)
        << r.status().to_string();
    EXPECT_NE(r.status().message().find(c.field), std::string::npos) << r.status().to_string();
  }
}

TEST(FetchRequest, MoreReadaheadHintsThanAllowedAreRefused) {
  FetchRequest r{.op = FetchRequest::Op::kSlice,
                 .step = 1,
                 .tensor = "t",
                 .slice = 0,
                 .region = {{0}, {1}},
                 .ahead = {}};
  for (std::size_t i = 0; i <= kMaxAheadHints; ++i) r.ahead.emplace_back("t", i);
  auto back = decode_fetch_request(encode_fetch_request(r), "rank 0");
  EXPECT_EQ(back.status().code(), Code::kCorruption);
  r.ahead.pop_back();
  EXPECT_OK(decode_fetch_request(encode_fetch_request(r), "rank 0"));
}

}  // namespace
}  // namespace ferry::checkpoint
