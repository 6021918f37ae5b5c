#!/usr/bin/env python3
"""Turns benchmark output into the PNGs of docs/benchmarks.md (Debian's python3-matplotlib).

    bench/plot.py sync  OUT.png RUN.json [RUN.json ...]  # `ferry bench sync --json` (shm), any
                                                         # mix of destinations / --bucket-callback
    bench/plot.py net   OUT.png RUN.json                 # `ferry bench sync --net --json`
    bench/plot.py ckpt  OUT.png RUN.txt                  # bench/ckpt_bench's printed table
    bench/plot.py delta OUT.png RUN.json                 # bench/delta_bench --json

Each picture puts ferry beside the limit its benchmark measured in the same run: memcpy (shm),
ucx_perftest on the same path (net), the disk's own bandwidth (checkpoints), memcpy of the
same bytes (delta). Exit status 2 and a message naming the file on input it cannot read.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import re
import statistics
import sys

try:
    import matplotlib
except ImportError:
    sys.exit("plot.py: needs matplotlib (Debian: apt-get install python3-matplotlib)")

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402  (after the backend is chosen)

DELIVERY_LABELS = {
    "destinations": "ferry, into destinations",
    "bucket_callback": "ferry, per-bucket callback (verl's API, ferry.verl)",
}


class InputError(Exception):
    pass


def load_json(path: pathlib.Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise InputError(f"{path}: not readable as JSON ({error})") from error


def field(row: dict, key: str, path: pathlib.Path):
    if key not in row:
        raise InputError(f"{path}: a result has no '{key}' (keys: {', '.join(sorted(row))})")
    return row[key]


def plot_sync(runs: list[pathlib.Path], axes) -> None:
    memcpy, buckets = [], set()
    for path in runs:
        data = load_json(path)
        delivery = data.get("delivery", "destinations")
        memcpy.append(field(data, "memcpy_gbps", path))
        series: dict[int, list[tuple[int, float]]] = {}
        for row in field(data, "results", path):
            receivers = field(row, "receivers", path)
            series.setdefault(receivers, []).append(
                (field(row, "bucket_mb", path), field(row, "gbps", path)))
        style = "-" if delivery == "destinations" else ":"
        for receivers, points in sorted(series.items()):
            points.sort()
            buckets.update(p[0] for p in points)
            axes.plot([p[0] for p in points], [p[1] for p in points], style, marker="o",
                      label=f"{DELIVERY_LABELS.get(delivery, delivery)}, {receivers} receiver(s)")
    axes.axhline(max(memcpy), color="gray", linestyle="--", label="memcpy, one thread")
    axes.set_xscale("log", base=2)
    axes.set_xticks(sorted(buckets), [str(b) for b in sorted(buckets)])
    axes.set_ylim(bottom=0)
    axes.set_xlabel("bucket (MiB)")
    axes.set_ylabel("GB/s per receiver")
    axes.set_title("Weight sync over shared memory")


def plot_net(path: pathlib.Path, axes) -> None:
    data = load_json(path)
    rows = field(data, "results", path)
    several_modes = len({row.get("wire_protect") for row in rows}) > 1
    labels, ferry_gbps, limit_gbps = [], [], []
    for row in rows:
        label = f"{field(row, 'bucket_mb', path)} MiB\n{field(row, 'nodes', path)} node(s)"
        labels.append(label + (f"\n{row['wire_protect']}" if several_modes else ""))
        ferry_gbps.append(field(row, "gbps_per_node", path))
        limit_gbps.append(field(row, "perftest_gbps", path))
    x = range(len(rows))
    axes.bar([i - 0.2 for i in x], ferry_gbps, width=0.4, label="ferry, GB/s per node")
    axes.bar([i + 0.2 for i in x], limit_gbps, width=0.4, color="gray",
             label="ucx_perftest tag_bw, same path")
    axes.set_xticks(list(x), labels)
    axes.set_ylabel("GB/s")
    axes.set_title("Weight sync across nodes (sender -> relay -> receiver)")


# ckpt_bench prints a fixed-width table under "case  seconds  GB/s  ratio"; a figure in the
# GB/s column ends where that header's "GB/s" ends (rows without one leave it blank).
CKPT_NUMBER = re.compile(r"[0-9]+\.[0-9]+")
# "disk D, ...: write (fsync included) 361 MB/s 1 stream, 598 MB/s 4 streams; read (cold) ..."
CKPT_DISK = re.compile(r"(?P<what>write|read) \([^)]*\) (?P<one>[0-9.]+) MB/s 1 stream, "
                       r"(?P<four>[0-9.]+) MB/s 4 streams")


def plot_ckpt(path: pathlib.Path, axes) -> None:
    try:
        text = path.read_text()
    except OSError as error:
        raise InputError(f"{path}: {error}") from error
    lines = text.splitlines()
    header = next((i for i, line in enumerate(lines) if line.startswith("case") and "GB/s" in line),
                  None)
    if header is None:
        raise InputError(f"{path}: no 'case seconds GB/s ratio' table of bench/ckpt_bench")
    gbps_end = lines[header].index("GB/s") + len("GB/s")
    cases = []
    for line in lines[header + 1:]:
        name = re.split(r" {2,}", line.strip())[0]
        for number in CKPT_NUMBER.finditer(line):
            if abs(number.end() - gbps_end) <= 1:
                cases.append((name, float(number.group())))
    if not cases:
        raise InputError(f"{path}: no 'case seconds GB/s' rows of bench/ckpt_bench's table")
    # "read the shard files" is plain reads of the step's files: the disk, not ferry.
    colors = ["gray" if name.startswith("read ") else "tab:blue" for name, _ in cases]
    axes.barh([c[0] for c in cases], [c[1] for c in cases], color=colors,
              label="ferry (gray: plain reads of the same files)")
    for match in CKPT_DISK.finditer(text):
        best = max(float(match["one"]), float(match["four"])) / 1000
        axes.axvline(best, linestyle="--", color="black" if match["what"] == "read" else "gray",
                     label=f"disk {match['what']}, best of its streams ({best:.2f} GB/s)")
    axes.invert_yaxis()
    axes.set_xlabel("GB/s")
    axes.set_title("Checkpoint save and load against the disk")


def plot_delta(path: pathlib.Path, axes) -> None:
    data = load_json(path)
    series: dict[str, list[tuple[float, float]]] = {}
    memcpy = []
    for row in field(data, "rows", path):
        density = field(row, "density", path)
        encode, apply = field(row, "encode_gbps", path), field(row, "apply_gbps", path)
        # Codec time of a round per GB of weights: encode at the sender plus apply at a receiver.
        series.setdefault(field(row, "encoding", path), []).append(
            (density, 1 / encode + 1 / apply))
        memcpy.append(field(row, "memcpy_gbps", path))
    for encoding, points in sorted(series.items()):
        points.sort()
        axes.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=encoding)
    # The median: memcpy is measured before each row and drifts with the machine's load.
    axes.axhline(2 / statistics.median(memcpy), color="gray", linestyle="--",
                 label="two memcpys (sender + receiver), median of the run")
    axes.set_xscale("log")
    axes.set_yscale("log")
    axes.set_xlabel("density (fraction of bf16 elements changed)")
    axes.set_ylabel("seconds per GB (encode + apply)")
    axes.set_title("Delta codec: round cost against density")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("kind", choices=["sync", "net", "ckpt", "delta"])
    parser.add_argument("out", type=pathlib.Path, help="the PNG to write")
    parser.add_argument("inputs", type=pathlib.Path, nargs="+", help="benchmark output files")
    args = parser.parse_args()
    if args.kind != "sync" and len(args.inputs) != 1:
        parser.error(f"{args.kind} takes one input file, got {len(args.inputs)}")
    figure, axes = plt.subplots(figsize=(8, 4.5), dpi=100)
    try:
        if args.kind == "sync":
            plot_sync(args.inputs, axes)
        else:
            {"net": plot_net, "ckpt": plot_ckpt, "delta": plot_delta}[args.kind](args.inputs[0], axes)
    except InputError as error:
        print(f"plot.py: {error}", file=sys.stderr)
        return 2
    axes.grid(True, alpha=0.3)
    axes.legend(fontsize="small")
    figure.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(args.out)
    print(f"plot.py: wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
