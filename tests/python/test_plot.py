"""bench/plot.py turns each benchmark's saved output (plot_samples/) into a PNG, and names the
file it cannot read. Skipped where matplotlib is missing (Debian: python3-matplotlib)."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest

pytest.importorskip("matplotlib")

HERE = pathlib.Path(__file__).resolve().parent
PLOT = HERE.parents[1] / "bench" / "plot.py"
SAMPLES = HERE / "plot_samples"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def plot(kind: str, out: pathlib.Path, *inputs: pathlib.Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(PLOT), kind, str(out), *map(str, inputs)],
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("kind, sample", [("sync", "sync.json"), ("net", "net.json"),
                                          ("ckpt", "ckpt.txt"), ("delta", "delta.json")])
def test_each_benchmark_becomes_a_png(tmp_path, kind, sample):
    out = tmp_path / "img" / f"{kind}.png"
    result = plot(kind, out, SAMPLES / sample)
    assert result.returncode == 0, result.stderr
    assert out.read_bytes()[:8] == PNG_MAGIC


def test_sync_takes_both_delivery_modes_in_one_picture(tmp_path):
    callback = json.loads((SAMPLES / "sync.json").read_text())
    callback["delivery"] = "bucket_callback"
    (tmp_path / "callback.json").write_text(json.dumps(callback))
    out = tmp_path / "both.png"
    result = plot("sync", out, SAMPLES / "sync.json", tmp_path / "callback.json")
    assert result.returncode == 0, result.stderr
    assert out.read_bytes()[:8] == PNG_MAGIC


def test_input_it_cannot_read_is_named(tmp_path):
    wrong = tmp_path / "wrong.json"
    wrong.write_text(json.dumps({"memcpy_gbps": 1.0, "results": [{"bucket_mb": 64}]}))
    result = plot("sync", tmp_path / "out.png", wrong)
    assert result.returncode == 2
    assert str(wrong) in result.stderr and "receivers" in result.stderr
    assert not (tmp_path / "out.png").exists()

    result = plot("ckpt", tmp_path / "out.png", SAMPLES / "sync.json")
    assert result.returncode == 2
    assert "sync.json" in result.stderr
