// Session tokens: the secret every node of a net session shares (docs/security.md). Net
// senders, receivers and relays read it themselves; these calls make a token and check the
// one a session would use, as `ferry token new` and `ferry token check` do.
//
// Nothing here returns or prints the secret of an existing token: a check reports where the
// token came from and how strong it is. All calls are thread-safe.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "ferry/export.h"
#include "ferry/status.h"

namespace ferry::token {

// The least strength a session token may have, in bits: net sessions refuse weaker ones.
inline constexpr double kMinBits = 128;

// An estimate of a secret's strength in bits: the cheapest description of it by common words
// (any case, substitutions such as 3 for e), runs ("abcd", "4321"), blocks repeated, years,
// hex digits at 4 bits each and decimal digits at 3.3, and otherwise log2 of the alphabet its
// character classes span per character (lowercase 26, uppercase 26, digits 10, other
// printable ASCII 33, other bytes 128); 0 when it uses fewer than 8 distinct characters.
// Only the first 256 characters count. docs/security.md ("Tokens") gives the costs; a
// token from new_text() is 256 bits by it.
FERRY_EXPORT double estimated_bits(std::string_view secret);

// A fresh token of `bytes` random bytes from the OS, hex-encoded (2 * bytes characters; the
// default gives 256 bits). An error only when the OS gives no randomness.
FERRY_EXPORT Result<std::string> new_text(std::size_t bytes = 32);

// Writes `text` and a newline to the file `path` with mode 0600, creating its parent folder
// (mode 0700) when missing. An existing file is kept (kAlreadyExists, whose message names
// --force) unless `replace`; a replaced file gets mode 0600 too. The file is fsynced.
FERRY_EXPORT Status write_file(const std::string& path, std::string_view text, bool replace);

// What a check found: never the secret itself.
struct Found {
  std::string source;  // where the token came from: "FERRY_TOKEN", "token file <path>"
  double bits = 0;     // estimated_bits() of the secret, at least kMinBits
};

// The token net sessions would use: FERRY_TOKEN when set, else the file FERRY_TOKEN_FILE
// names. The errors are the ones a session would report: kNotFound when neither is set;
// kInvalidArgument for an empty or weak token (the message says how to make a strong one);
// kFailedPrecondition for a file not owned by this user or readable by others (the message
// gives the chmod).
FERRY_EXPORT Result<Found> check_env();
// The same for the token in the file `path`.
FERRY_EXPORT Result<Found> check_file(const std::string& path);

}  // namespace ferry::token
