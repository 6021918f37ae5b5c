#!/usr/bin/env python3
"""libferry.so exports its public API and nothing else.

Usage: check_exports.py LIBFERRY_SO INCLUDE_FERRY_DIR [CLI_BINARY]

libferry is built with hidden visibility; FERRY_EXPORT (include/ferry/export.h) marks what the
headers in include/ferry/ declare. Every symbol `nm -D --defined-only` lists must be a member
of a class or a function those headers declare FERRY_EXPORT, in namespace ferry or one of its
public namespaces (ferry::sync, ferry::checkpoint, ...). An internal class there
(ferry::sync::BucketPlanner, ferry::net::Channel, ferry::wire::Message) fails the test.

With CLI_BINARY, also checks that the CLI holds no second copy of libferry's state: it may
link stateless internals (fd owners, token text) statically, but a global or static variable
of namespace ferry outside ferry::cli and ferry::tools would diverge from libferry's own
(the logger, the profiler session, test overrides).
"""
import re
import subprocess
import sys
from pathlib import Path

# Symbols every shared object defines, whatever its code.
RUNTIME = {"_init", "_fini", "__bss_start", "_edata", "_end"}
# Prefixes nm -C puts before a class's special symbols.
SPECIAL = re.compile(r"^(typeinfo name for |typeinfo for |vtable for |VTT for |"
                     r"construction vtable for .*-in-|guard variable for |"
                     r"non-virtual thunk to |virtual thunk to )")


def public_names(include_dir):
    """Namespaces, and names declared FERRY_EXPORT, in the public headers."""
    namespaces, names = {"ferry"}, set()
    for header in Path(include_dir).glob("*.h"):
        text = header.read_text()
        for m in re.finditer(r"namespace\s+([\w:]+)\s*\{", text):
            namespaces.update(m.group(1).split("::"))
        for m in re.finditer(r"\b(?:class|struct)\s+(?:\[\[\w+\]\]\s+)?FERRY_EXPORT\s+(\w+)", text):
            names.add(m.group(1))
        for m in re.finditer(r"FERRY_EXPORT\s+([^;{}]*?)\b(\w+)\s*\(", text):
            if not m.group(1).lstrip().startswith(("class", "struct")):
                names.add(m.group(2))
    return namespaces, names


def split_qualified(symbol):
    """'a::b<c::d>::e(int) const' -> ['a', 'b', 'e']: the qualified name before its parameters."""
    parts, depth, current = [], 0, ""
    i = 0
    while i < len(symbol):
        c = symbol[i]
        if c == "(" and depth == 0 and not current.endswith("operator"):
            break
        depth += c in "<("
        depth -= c in ">)"
        if depth == 0 and symbol.startswith("::", i):
            parts.append(current)
            current, i = "", i + 2
            continue
        current += c
        i += 1
    parts.append(current)
    return [re.sub(r"<.*", "", p) for p in parts]


def nm(path, *flags):
    out = subprocess.run(["nm", "-C", *flags, path], check=True, capture_output=True, text=True)
    for line in out.stdout.splitlines():
        fields = line.split(" ", 2)
        if len(fields) == 3:
            yield fields[1], fields[2]


def library_instantiation(kind, name):
    """A weak instantiation of a standard-library template (std::vector<...>::_M_realloc_insert,
    typeinfo for std::_Sp_counted_ptr_inplace<...>): libstdc++ declares its namespace with
    default visibility, so -fvisibility=hidden leaves these exported. They are identical in
    every object that instantiates them and are no part of ferry's API."""
    head = name.split("(", 1)[0]
    while re.search(r"<[^<>]*>", head):  # template arguments may name ferry types
        head = re.sub(r"<[^<>]*>", "", head)
    return (kind in "WVu" and re.search(r"(^|\s)(std|__gnu_cxx)::", head) is not None
            and re.search(r"(^|\s)ferry::", head) is None)


def check_library(lib, include_dir):
    namespaces, names = public_names(include_dir)
    bad = []
    for kind, symbol in nm(lib, "-D", "--defined-only"):
        name = re.sub(r"\[abi:\w+\]", "", SPECIAL.sub("", symbol))
        if symbol in RUNTIME or library_instantiation(kind, name):
            continue
        parts = split_qualified(name)
        rest = parts[1:] if parts[0] == "ferry" else []
        while rest and rest[0] in namespaces and rest[0] not in names:
            rest = rest[1:]  # ferry::sync::Sender -> Sender
        if not (rest and rest[0] in names):
            bad.append(f"{kind} {symbol}")
    return bad


def read_only_symbols(path):
    """Names of the objects in read-only sections. Constants are no state even when a build
    makes them unique globals (`u`): the sanitizer builds do so for inline constexpr ones."""
    out = subprocess.run(["objdump", "-t", "-C", path], check=True, capture_output=True,
                         text=True)
    names = set()
    for line in out.stdout.splitlines():
        m = re.match(r"^[0-9a-f]+ .{7} (\S+)\s+[0-9a-f]+\s+(?:\.hidden )?(.*)$", line)
        if m and (m.group(1).startswith(".rodata") or m.group(1) == ".data.rel.ro"):
            names.add(m.group(2))
    return names


def check_cli(cli):
    bad = []
    constants = read_only_symbols(cli)
    for kind, symbol in nm(cli, "--defined-only"):
        if symbol in constants:
            continue
        if kind.lower() not in "bdgsvu" and not symbol.startswith("guard variable for "):
            continue
        if symbol.startswith(("typeinfo", "vtable", "VTT", "construction vtable")):
            continue  # read-only type data, not state
        name = SPECIAL.sub("", symbol)
        if name.startswith("ferry::") and not name.startswith(("ferry::cli::", "ferry::tools::")):
            bad.append(f"{kind} {symbol}")
    return bad


def main():
    if len(sys.argv) not in (3, 4):
        sys.exit(__doc__)
    failed = False
    bad = check_library(sys.argv[1], sys.argv[2])
    if bad:
        failed = True
        print(f"{sys.argv[1]} exports {len(bad)} symbol(s) outside ferry's public API "
              "(mark public ones FERRY_EXPORT in include/ferry/; internals stay hidden):")
        print("\n".join("  " + b for b in sorted(bad)[:200]))
    if len(sys.argv) == 4:
        bad = check_cli(sys.argv[3])
        if bad:
            failed = True
            print(f"{sys.argv[3]} holds {len(bad)} copies of libferry state (link them through "
                  "the public API, not a static module library):")
            print("\n".join("  " + b for b in sorted(bad)[:200]))
    if not failed:
        print("libferry exports only its public API")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
