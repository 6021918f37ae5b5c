#!/usr/bin/env python3
"""The source files one sync round crosses, measured: runs tests/structure/one_round (a shm
round, or a net round through a relay) under valgrind's callgrind, collecting only inside
Sender::send_round, Receiver::receive_round and Relay::relay_round, and lists the project's
files whose code ran there (inlined code counts for the header it is written in).

  scripts/round_units.py --binary build/tests/one_round shm        # print the list
  scripts/round_units.py --binary build/tests/one_round --check docs/architecture.md

--check compares each kind's source units (the .cc files) with the list in the doc between
`<!-- round-units:KIND -->` and `<!-- /round-units:KIND -->` (paths in backticks) and fails
naming what differs, so the doc cannot drift from the code. Headers are counted, not
compared: which inline code runs where is the compiler's choice.
"""

import argparse
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[1]
# Whole names: a nested function whose name also matches would switch collection off again
# (callgrind toggles on every entry), e.g. a lambda of receive_round.
ROUND_FUNCTIONS = ["ferry::sync::Sender::send_round(*", "ferry::sync::Receiver::receive_round(*",
                   "ferry::sync::Relay::relay_round(*"]
NAME = re.compile(r"^(fl|fi|fe|cfi|cfl|fn|cfn)=\((\d+)\)(?: (.*))?$")


def files_with_cost(profile_text):
    """Files (as callgrind names them) whose own lines have a non-zero cost."""
    names = {}  # (kind: file or fn, id) -> name; callgrind names each once, then uses the id
    current = None  # the file the next cost lines belong to
    function_file = None
    after_calls = False  # the cost line after `calls=` is the call's inclusive cost
    ran = set()
    for line in profile_text.splitlines():
        m = NAME.match(line)
        if m:
            kind, ident, name = m.groups()
            space = "fn" if kind in ("fn", "cfn") else "file"
            if name:
                names[(space, ident)] = name
            if kind == "fl":
                function_file = current = names.get(("file", ident))
            elif kind in ("fi", "fe"):
                current = names.get(("file", ident))
            elif kind == "fn":
                current = function_file
            continue
        if line.startswith("calls="):
            after_calls = True
            continue
        if not line or not (line[0].isdigit() or line[0] in "+-*"):
            continue
        if after_calls:
            after_calls = False
            continue
        costs = line.split()[1:]
        if current and any(c != "0" for c in costs):
            ran.add(current)
    return ran


def project_files(paths):
    out = set()
    for p in paths:
        try:
            rel = pathlib.Path(os.path.realpath(p)).relative_to(ROOT)
        except ValueError:
            continue
        if rel.parts[0] in ("src", "include"):
            out.add(str(rel))
    return sorted(out)


def measure(binary, kind):
    with tempfile.TemporaryDirectory() as d:
        out = pathlib.Path(d) / "callgrind.%p"
        # Per thread: the toggle is a thread's own, so sender and receiver threads do not
        # switch collection off for each other.
        cmd = ["valgrind", "--tool=callgrind", "--separate-threads=yes",
               f"--callgrind-out-file={out}"]
        cmd += [f"--toggle-collect={f}" for f in ROUND_FUNCTIONS]
        cmd += [str(binary), kind]
        run = subprocess.run(cmd, capture_output=True, text=True)
        if run.returncode != 0:
            sys.exit(f"round_units: {' '.join(cmd)} failed ({run.returncode}):\n"
                     f"{run.stdout}{run.stderr[-4000:]}")
        ran = set()
        for profile in pathlib.Path(d).glob("callgrind.*"):
            ran |= files_with_cost(profile.read_text(errors="replace"))
    return project_files(ran)


def documented(doc, kind):
    text = pathlib.Path(doc).read_text()
    m = re.search(rf"<!-- round-units:{kind} -->(.*?)<!-- /round-units:{kind} -->", text, re.S)
    if not m:
        sys.exit(f"round_units: {doc} has no <!-- round-units:{kind} --> list")
    return sorted(re.findall(r"`([^`]+)`", m.group(1)))


def units(files):
    """.cc files, and all files: the two counts the doc gives."""
    return sum(f.endswith(".cc") for f in files), len(files)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--binary", required=True, help="the built tests/structure/one_round")
    ap.add_argument("--check", metavar="DOC", help="compare with the lists in DOC")
    ap.add_argument("kinds", nargs="*", default=["shm", "net"], help="shm, net (default both)")
    args = ap.parse_args()
    if shutil.which("valgrind") is None:
        sys.exit("round_units: valgrind is not installed (apt-get install valgrind)")
    failed = False
    for kind in args.kinds:
        files = measure(args.binary, kind)
        cc, total = units(files)
        print(f"{kind}: {cc} source units ({total} files with headers)")
        sources = [f for f in files if f.endswith(".cc")]
        if not args.check:
            print("\n".join(f"  `{f}`" for f in sources))
            continue
        want = documented(args.check, kind)
        files = sources
        if files != want:
            failed = True
            for f in sorted(set(files) - set(want)):
                print(f"  ran but not in {args.check}: {f}")
            for f in sorted(set(want) - set(files)):
                print(f"  in {args.check} but did not run: {f}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
