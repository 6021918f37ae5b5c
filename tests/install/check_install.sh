#!/usr/bin/env bash
# Builds tests/install/consumer against an installed ferry (prefix in $1), with
# CMake's find_package and with pkg-config, and runs both programs and the installed CLI.
set -euo pipefail
prefix=$1
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
libdir=$(find "$prefix" -name 'libferry.so' -printf '%h\n' | head -n 1)
cmake -S "$here/consumer" -B "$work/cmake" -G Ninja -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
ninja -C "$work/cmake" >/dev/null
LD_LIBRARY_PATH="$libdir" "$work/cmake/consumer"
PKG_CONFIG_PATH="$libdir/pkgconfig" c++ -o "$work/pc_consumer" "$here/consumer/main.cc" \
  $(PKG_CONFIG_PATH="$libdir/pkgconfig" pkg-config --cflags --libs ferry)
LD_LIBRARY_PATH="$libdir" "$work/pc_consumer"
"$prefix/bin/ferry" advise-bucket --shape 151936x4096 --dtype float32 | grep -q "update_weights_bucket_megabytes=4096"
echo "install check: find_package, pkg-config and the installed ferry binary work"
