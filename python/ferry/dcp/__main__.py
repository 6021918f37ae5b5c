"""python -m ferry.dcp: serve or check a ferry.dcp checkpoint folder on this node.

    python -m ferry.dcp serve FOLDER [--listen HOST:PORT]   # for loads with no rank here
    python -m ferry.dcp verify FOLDER                       # this node's files against the index
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading

from . import _fetch, _index


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m ferry.dcp",
        description="Serve or verify this node's part of a ferry.dcp checkpoint.")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="serve this node's files to loads on other nodes "
                           "(secret: FERRY_TOKEN or FERRY_TOKEN_FILE, as every net session)")
    serve.add_argument("folder")
    serve.add_argument("--listen", default="0.0.0.0:0",
                       help="HOST:PORT to listen on (default: every interface, a free port)")
    verify = sub.add_parser("verify", help="check this node's files against its index")
    verify.add_argument("folder")
    args = parser.parse_args(argv)

    try:
        index = _index.read_committed(args.folder)
    except (OSError, ValueError) as e:
        print(f"ferry.dcp: {e}", file=sys.stderr)
        return 1
    here = {}
    for entry in index.files.values():
        path = os.path.join(args.folder, entry.path)
        if os.path.exists(path):
            here[entry.path] = (entry, _index.describe(path))

    if args.command == "verify":
        bad = [p for p, (e, got) in here.items() if got != (e.bytes, e.xxh3)]
        elsewhere = sorted(set(index.files) - set(here))
        for p in bad:
            print(f"DAMAGED {p}: differs from the index (size or XXH3)")
        print(f"{len(here) - len(bad)} files OK here, {len(bad)} damaged, {len(elsewhere)} on "
              f"other nodes" + (f" ({', '.join(elsewhere)})" if elsewhere else ""))
        return 1 if bad else 0

    good = [e for p, (e, got) in here.items() if got == (e.bytes, e.xxh3)]
    server = _fetch.serve_on(args.folder, good, args.listen, "")
    print(f"serving {len(good)} files of {args.folder} at {server.address}", flush=True)
    done = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: done.set())
    done.wait()
    server.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
