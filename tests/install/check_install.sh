#!/usr/bin/env bash
# Builds tests/install/consumer against an installed ferry (prefix in $1), with
# CMake's find_package and with pkg-config, and runs both programs and the installed CLI;
# checks the man page and bash completion landed in share/.
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
# The man page and bash completion (cmake/cli_docs.cmake) name every top-level command.
man_page="$prefix/share/man/man1/ferry.1"
completion="$prefix/share/bash-completion/completions/ferry"
[ -s "$man_page" ] || { echo "install check: no man page at $man_page" >&2; exit 1; }
[ -s "$completion" ] || { echo "install check: no bash completion at $completion" >&2; exit 1; }
commands=$("$prefix/bin/ferry" --help | sed -n '/^Subcommands:/,/^$/p' | awk 'NR > 1 && NF {print $1}')
for command in $commands; do
  grep -q "^\\.SS \"ferry $command\"" "$man_page" || { echo "install check: man page lacks 'ferry $command'" >&2; exit 1; }
done
# Completing `ferry sy` in bash offers `sync`.
reply=$(bash -c 'source "$1"; COMP_WORDS=(ferry sy); COMP_CWORD=1; _ferry; echo "${COMPREPLY[*]}"' _ "$completion")
[ "$reply" = sync ] || { echo "install check: completing 'ferry sy' gave '$reply', not 'sync'" >&2; exit 1; }
"$prefix/bin/ferry" advise-bucket --shape 151936x4096 --dtype float32 | grep -q "update_weights_bucket_megabytes=4096"
echo "install check: find_package, pkg-config, the installed ferry binary, man page and completion work"
