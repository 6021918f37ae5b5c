// Uses the installed public API: prints the advice for the FAQ's 7B embedding.
#include <cstdio>

#include "ferry/model.h"
#include "ferry/tensor.h"
#include "ferry/version.h"

int main() {
  auto spec =
      ferry::TensorSpec::make("model.embed_tokens.weight", ferry::DType::kF32, {151936, 4096});
  if (!spec.ok()) return 1;
  auto advice = ferry::model::advise_bucket(spec->bytes());
  if (!advice.ok()) return 1;
  std::printf("ferry %s: %llu\n", ferry::version(),
              static_cast<unsigned long long>(advice->bucket_mb));
  return advice->bucket_mb == 4096 ? 0 : 1;
}
