#!/usr/bin/env bash
# Sets up a fresh Debian 12 machine and runs every ferry test:
#   1. installs the Debian packages (scripts/install-deps.sh),
#   2. builds and runs all tests (C++ unit, CLI, Python, netns, the full-depth scale tier
#      `ctest -L scale`) with warnings as errors,
#   3. builds with address+undefined sanitizers and runs the unit tests again,
#   4. builds the libFuzzer targets with clang and runs each for FERRY_FUZZ_SECONDS (45),
#   5. checks that `cmake --install` gives a package another project can find_package().
# Set FERRY_QUICK=1 to skip steps 3-5.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
step() { printf '\n=== %s (at %d s)\n' "$*" "$SECONDS"; }

step "dependencies"
bash scripts/install-deps.sh
# The pinned Python environment first (python3 is its interpreter), then Debian's cmake and
# ctest ahead of any pip-installed cmake on PATH.
export PATH="$root/.venv/bin:/usr/bin:$PATH"
echo "python3: $(command -v python3) ($(python3 --version)); $(cmake --version | head -1) at $(command -v cmake)"

step "build (build/)"
# Line tables only (-g1): a third less compile time than full debug info, same code.
FERRY_BUILD_DIR=build bash scripts/build.sh -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O2 -g1 -DNDEBUG" \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 -g1 -DNDEBUG"
step "tests"
ctest --test-dir build --output-on-failure -j2 --timeout 600

if [ "${FERRY_QUICK:-0}" = 1 ]; then exit 0; fi

step "address+undefined sanitizers (build-asan/)"
# -O1 with line tables only, as the sanitizers' and libFuzzer's docs advise: it compiles in
# less than half the time of -O2 -g here (ASan+UBSan at -O2 was the slowest step of CI).
quick_flags=(-DCMAKE_C_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG"
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG")
FERRY_BUILD_DIR=build-asan bash scripts/build.sh -DFERRY_SANITIZE=address -DFERRY_BUILD_PYTHON=OFF \
  -DFERRY_BUILD_BENCH=OFF "${quick_flags[@]}"
# A test that fails is run once more before it counts as failed: the sanitizers slow the
# multi-process tests that carry deadlines (NetGroup.CollectivesAcrossNodes,
# ReplicateStall.*) enough that two at once on 2 cores can miss one; a real fault fails twice.
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
  ctest --test-dir build-asan --output-on-failure -j2 --timeout 900 -LE scale --repeat until-pass:2

step "fuzzing (build-fuzz/, ${FERRY_FUZZ_SECONDS:-45} s per target)"
CC=clang CXX=clang++ cmake -S . -B build-fuzz -G Ninja -DFERRY_BUILD_FUZZ=ON -DFERRY_BUILD_TESTS=OFF \
  -DFERRY_BUILD_BENCH=OFF -DFERRY_BUILD_PYTHON=OFF "${quick_flags[@]}" >/dev/null
# Only the fuzz targets and the modules they link (not the CLI, convert, device, ...).
mapfile -t fuzz_names < <(cd fuzz && ls -- *_fuzz.cc | sed 's/\.cc$//')
ninja -C build-fuzz "${fuzz_names[@]}"
# Two targets at a time (one per core), each for the same time.
fuzz_one() {
  local target=$1 name work
  name=$(basename "$target")
  work=$(mktemp -d)
  "$target" -max_total_time="${FERRY_FUZZ_SECONDS:-45}" -max_len=65536 -print_final_stats=1 \
    "$work" "fuzz/corpus/$name" >"$work.log" 2>&1
  local rc=$?
  echo "fuzz: $name (exit $rc)"; tail -n 3 "$work.log"
  rm -rf "$work" "$work.log"
  return $rc
}
targets=(build-fuzz/fuzz/*_fuzz)
for ((i = 0; i < ${#targets[@]}; i += 2)); do
  fuzz_one "${targets[i]}" &
  first=$!
  second=""
  if [ $((i + 1)) -lt ${#targets[@]} ]; then fuzz_one "${targets[i + 1]}" & second=$!; fi
  wait "$first"
  [ -z "$second" ] || wait "$second"
done

step "install and find_package(ferry) from another project"
prefix=$(mktemp -d)
cmake --install build --prefix "$prefix" >/dev/null
bash tests/install/check_install.sh "$prefix"
rm -rf "$prefix"
echo "all tests passed in $SECONDS s"
