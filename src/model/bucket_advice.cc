#include <cmath>
#include <string>

#include "ferry/model.h"

namespace ferry::model {

Result<BucketAdvice> advise_bucket(std::uint64_t largest_bytes, double margin) {
  if (!std::isfinite(margin) || margin < 1.0 || margin > 16.0) {
    return invalid_argument(
        "bucket margin " + std::to_string(margin) +
        " is out of range: use a factor from 1.0 to 16 (the FAQ suggests 1.2-1.5)");
  }
  BucketAdvice a;
  a.largest_bytes = largest_bytes;
  a.largest_mb = static_cast<double>(largest_bytes) / (1024.0 * 1024.0);
  a.margin = margin;
  const double needed_mb = a.largest_mb * margin;
  a.bucket_mb = 1;
  while (static_cast<double>(a.bucket_mb) < needed_mb) a.bucket_mb *= 2;
  a.override_line = std::string(kVerlBucketKey) + "=" + std::to_string(a.bucket_mb);
  return a;
}

}  // namespace ferry::model
