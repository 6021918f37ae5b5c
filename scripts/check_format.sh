#!/usr/bin/env bash
# Fails naming each C++ file of the repository that clang-format (.clang-format) would change.
# Usage: scripts/check_format.sh [clang-format binary]
set -euo pipefail
cd "$(dirname "$0")/.."
fmt=${1:-clang-format}
bad=0
while IFS= read -r f; do
  if ! "$fmt" --dry-run -Werror "$f" >/dev/null 2>&1; then
    echo "not formatted: $f (run: $fmt -i $f)"
    bad=1
  fi
done < <(git ls-files '*.cc' '*.h' 2>/dev/null || find src include tests bench fuzz python -name '*.cc' -o -name '*.h')
exit $bad
