// The token strength estimate (auth.h: estimate_token): the cheapest way to describe the
// secret as a guesser that knows common words, runs, repeats, years and hex would, found by
// dynamic programming over the characters, in bits. In the spirit of zxcvbn (Wheeler, USENIX
// Security 2016), much smaller: a few hundred words, no keyboard graphs beyond the rows.
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <string>
#include <vector>

#include "transport/net/auth.h"

namespace ferry::net {
namespace {

// Characters past this are not looked at (and count nothing): a secret that has not
// reached 128 bits in 256 characters is not one to keep.
constexpr std::size_t kMaxEstimated = 256;
// Inside a run of this many hex digits (what `ferry token new` and `openssl rand -hex` make)
// words and years are not looked for, and runs and repeats must be longer: a random hex
// string holds a short "word" or "1999" often enough to be marked down for it by chance.
constexpr std::size_t kLongHexRun = 16;
constexpr std::size_t kMinRun = 4;          // "abcd", "4321"
constexpr std::size_t kMinRunInHex = 6;     // inside a long hex run
constexpr std::size_t kMinRepeat = 4;       // a block seen before
constexpr std::size_t kMinRepeatInHex = 6;  // inside a long hex run

// Common password words, names of the seasons and months, and words a token for this
// software tends to be built of. Lowercase, at least 4 letters, none made only of the
// letters a to f (which random hex would hold by chance).
// One string, not an array of pointers: constant bytes (.rodata), so the CLI, which links
// this file, holds no relocated copy of libferry data (tests/exports/check_exports.py).
constexpr char kWordList[] =
    "password passwd pass secret token ferry test testing admin administrator root user "
    "guest login welcome hello world letmein master dragon monkey shadow sunshine princess "
    "football baseball soccer hockey basketball superman batman iloveyou love trustno trust "
    "access changeme change default example sample demo prod production staging develop "
    "cluster node train training model sync weight weights verl torch cuda nvidia server "
    "client listener sender receiver relay alpha beta gamma delta another right wrong good "
    "none null keys private public company spring summer autumn winter january february "
    "march april june july august september october november december monday tuesday "
    "wednesday thursday friday saturday sunday qwerty qwertz azerty qwertyuiop asdf asdfgh "
    "asdfghjkl zxcv zxcvbn zxcvbnm qazwsx starwars pokemon computer internet michael "
    "jennifer jordan thomas robert daniel charlie george hunter ranger buster tigger ginger "
    "pepper cheese cookie orange banana apple purple silver golden secure security system "
    "service network database backup office github google linux ubuntu debian python killer "
    "freedom whatever nothing something matrix magic mustang harley maverick phoenix samsung "
    "liverpool chelsea arsenal yankees cowboys eagles flower forever family friend friends "
    "happy lucky money angel heaven blue green black white yellow sword wizard open sesame "
    "opensesame ticket session auth cert mypass mysecret qwer asdfasdf temp local localhost "
    "random string value from file";

constexpr std::size_t word_count() {
  std::size_t n = 1;
  for (char c : kWordList) n += c == ' ' ? 1 : 0;
  return n;
}

// Calls f(word) for each word of kWordList.
template <typename F>
void for_each_word(F f) {
  std::string_view rest(kWordList);
  while (!rest.empty()) {
    const std::size_t space = rest.find(' ');
    f(rest.substr(0, space));
    if (space == std::string_view::npos) break;
    rest.remove_prefix(space + 1);
  }
}

enum class Kind { kBrute, kHex, kDigits, kWord, kRun, kRepeat, kYear };

struct Step {
  double bits = 0;
  std::size_t from = 0;  // the previous cut
  Kind kind = Kind::kBrute;
};

bool is_hex(char c) {
  return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}
bool is_digit(char c) { return c >= '0' && c <= '9'; }

// Whether `c` may stand for the lowercase letter `letter` (case, and common substitutions).
bool stands_for(char c, char letter, bool* upper, bool* substituted) {
  const auto u = static_cast<unsigned char>(c);
  if (c == letter) return true;
  if (std::isupper(u) && std::tolower(u) == letter) {
    *upper = true;
    return true;
  }
  static constexpr std::array<std::pair<char, char>, 13> kLeet = {{{'0', 'o'},
                                                                   {'1', 'i'},
                                                                   {'1', 'l'},
                                                                   {'!', 'i'},
                                                                   {'3', 'e'},
                                                                   {'4', 'a'},
                                                                   {'@', 'a'},
                                                                   {'5', 's'},
                                                                   {'$', 's'},
                                                                   {'7', 't'},
                                                                   {'+', 't'},
                                                                   {'8', 'b'},
                                                                   {'9', 'g'}}};
  for (const auto& [from, to] : kLeet) {
    if (c == from && letter == to) {
      *substituted = true;
      return true;
    }
  }
  return false;
}

// For each position: the length of the run of hex digits of one case that holds it, and of
// the run of decimal digits.
std::vector<std::size_t> runs_of(std::string_view s, bool (*member)(char)) {
  std::vector<std::size_t> out(s.size(), 0);
  for (std::size_t i = 0; i < s.size();) {
    if (!member(s[i])) {
      ++i;
      continue;
    }
    std::size_t j = i;
    bool lower = false, upper = false;
    while (j < s.size() && member(s[j])) {
      lower |= std::islower(static_cast<unsigned char>(s[j])) != 0;
      upper |= std::isupper(static_cast<unsigned char>(s[j])) != 0;
      if (lower && upper) break;  // "aB": not one hex string
      ++j;
    }
    for (std::size_t k = i; k < j; ++k) out[k] = j - i;
    i = j;
  }
  return out;
}

}  // namespace

TokenEstimate estimate_token(std::string_view secret) {
  TokenEstimate out;
  bool lower = false, upper = false, digit = false, punct = false, other = false;
  std::array<bool, 256> seen{};
  std::size_t distinct = 0;
  for (const char c : secret) {
    const auto u = static_cast<unsigned char>(c);
    if (!seen[u]) ++distinct;
    seen[u] = true;
    if (u >= 'a' && u <= 'z')
      lower = true;
    else if (u >= 'A' && u <= 'Z')
      upper = true;
    else if (u >= '0' && u <= '9')
      digit = true;
    else if (u >= 0x20 && u < 0x7f)
      punct = true;
    else
      other = true;
  }
  if (distinct < 8) {
    out.weaknesses.push_back("fewer than 8 distinct characters");
    return out;
  }
  const int alphabet =
      (lower ? 26 : 0) + (upper ? 26 : 0) + (digit ? 10 : 0) + (punct ? 33 : 0) + (other ? 128 : 0);
  const double brute = std::log2(static_cast<double>(alphabet));

  const std::string_view s = secret.substr(0, std::min(secret.size(), kMaxEstimated));
  const std::size_t n = s.size();
  const auto hex = runs_of(s, is_hex);
  const auto digits = runs_of(s, is_digit);
  const auto in_long_hex = [&](std::size_t from, std::size_t to) {
    for (std::size_t k = from; k < to; ++k) {
      if (hex[k] >= kLongHexRun) return true;
    }
    return false;
  };

  std::vector<Step> best(n + 1);
  const auto offer = [&](std::size_t from, std::size_t to, double bits, Kind kind) {
    const double total = best[from].bits + bits;
    if (total < best[to].bits) best[to] = Step{total, from, kind};
  };
  for (std::size_t i = 1; i <= n; ++i) best[i].bits = HUGE_VAL;
  const double word_bits = std::log2(static_cast<double>(word_count()));

  for (std::size_t j = 0; j < n; ++j) {
    // One character at a time: the hex alphabet inside a hex string, digits in a number.
    double one = brute;
    Kind kind = Kind::kBrute;
    if (hex[j] >= 8 && 4.0 < one) {
      one = 4.0;
      kind = Kind::kHex;
    } else if (digits[j] >= 4 && std::log2(10.0) < one) {
      one = std::log2(10.0);
      kind = Kind::kDigits;
    }
    offer(j, j + 1, one, kind);

    // Runs with a constant step of one: "abcdef", "98765".
    for (const int step : {1, -1}) {
      std::size_t k = j + 1;
      while (k < n && std::isalnum(static_cast<unsigned char>(s[k])) &&
             std::isalnum(static_cast<unsigned char>(s[j])) && s[k] - s[k - 1] == step) {
        ++k;
      }
      for (std::size_t to = j + kMinRun; to <= k; ++to) {
        if (to - j < (in_long_hex(j, to) ? kMinRunInHex : kMinRun)) continue;
        offer(j, to, std::log2(2.0 * 62) + std::log2(static_cast<double>(to - j)), Kind::kRun);
      }
    }

    // A block seen earlier (it may overlap its copy, as "aaaa" does): where, and how long.
    for (std::size_t q = 0; q < j; ++q) {
      std::size_t m = 0;
      while (j + m < n && s[q + m] == s[j + m]) ++m;
      for (std::size_t to = j + kMinRepeat; to <= j + m; ++to) {
        if (to - j < (in_long_hex(j, to) ? kMinRepeatInHex : kMinRepeat)) continue;
        offer(j, to, std::log2(static_cast<double>(j)) + std::log2(static_cast<double>(to - j)) + 1,
              Kind::kRepeat);
      }
    }

    // Words (any case, common substitutions) and years: not inside a long hex string.
    for_each_word([&](std::string_view w) {
      if (j + w.size() > n || in_long_hex(j, j + w.size())) return;
      bool up = false, sub = false, match = true;
      for (std::size_t k = 0; k < w.size() && match; ++k)
        match = stands_for(s[j + k], w[k], &up, &sub);
      if (match) offer(j, j + w.size(), word_bits + (up ? 1 : 0) + (sub ? 1 : 0), Kind::kWord);
    });
    if (j + 4 <= n && !in_long_hex(j, j + 4) &&
        ((s[j] == '1' && s[j + 1] == '9') || (s[j] == '2' && s[j + 1] == '0')) &&
        is_digit(s[j + 2]) && is_digit(s[j + 3])) {
      offer(j, j + 4, std::log2(200.0), Kind::kYear);
    }
  }
  out.bits = best[n].bits;

  // What the cheapest description used, for the error message (never the characters).
  std::array<bool, 7> used{};
  std::size_t hex_digits = 0;
  for (std::size_t i = n; i > 0; i = best[i].from) {
    used[static_cast<std::size_t>(best[i].kind)] = true;
    if (best[i].kind == Kind::kHex) ++hex_digits;
  }
  if (used[static_cast<std::size_t>(Kind::kRepeat)]) {
    out.weaknesses.push_back("it repeats a block of itself");
  }
  if (used[static_cast<std::size_t>(Kind::kWord)]) {
    out.weaknesses.push_back("it is built of common words or names");
  }
  if (used[static_cast<std::size_t>(Kind::kRun)]) {
    out.weaknesses.push_back("it holds a run such as abcd or 4321");
  }
  if (used[static_cast<std::size_t>(Kind::kYear)]) out.weaknesses.push_back("it holds a year");
  if (used[static_cast<std::size_t>(Kind::kHex)]) {
    out.weaknesses.push_back(
        fmt::format("its random-looking part is {} hex digits, {} bits, whatever comes around them",
                    hex_digits, 4 * hex_digits));
  }
  if (out.weaknesses.empty()) {
    out.weaknesses.push_back(
        fmt::format("{} characters are too few for the characters it uses", secret.size()));
  }
  return out;
}

double estimated_token_bits(std::string_view secret) { return estimate_token(secret).bits; }

}  // namespace ferry::net
