#!/usr/bin/env bash
# Device check (issue #17 item 3), for a machine with a CUDA GPU and torch; run it whenever
# one is at hand (a few minutes). It prints, for a bf16 qwen2.5-0.5b-shaped model:
#   - torch's own copy rates: D2H and H2D, into/from pinned and pageable host memory;
#   - the device path's two legs (engine_kwargs.ferry.device, python/ferry/verl/_device_path.py)
#     with its own code: the master's D2H, each tensor copied from the GPU straight into a
#     ring page-locked once (ferry.Sender.ring_memory, cudaHostRegister), waited for once per
#     16 MiB segment as send_update(device=...) does; the rollout's H2D, each bucket copied from
#     the registered ring into a device buffer (DeviceReceive); each against torch's pinned rate;
#   - whole updates through the checkpoint engine, colocated, CUDA tensors on both ends and
#     engine_kwargs.ferry.device=cuda:0 (bench/python_sync.py --device).
#
# Offline use: ferry comes as a bundle made on the build machine, holding the Python
# package and every shared library it loads beyond glibc, so the CUDA machine needs
# only python3 with torch (the same Python minor version as the build):
#   bash bench/device_check.sh --bundle ferry-device.tar.gz   # build machine, after
#                                                            # ninja ferry_python_package
#   bash bench/device_check.sh ferry-device.tar.gz            # CUDA machine
# or, with a build tree on the CUDA machine: bash bench/device_check.sh build/python
#
# Exit status: 0 measured; 2 no CUDA device usable by torch; 3 ferry cannot be loaded.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
PYTHON=${PYTHON:-python3}
usage() {
  echo "usage: $0 BUNDLE.tar.gz | BUILD/python | --bundle OUT.tar.gz [BUILD/python]"
  exit 1
}
[ $# -ge 1 ] || usage

if [ "$1" = "--bundle" ]; then
  out=$(readlink -f "${2:?$(usage)}")
  package=$(readlink -f "${3:-$HERE/../build/python}")
  if [ ! -d "$package/ferry" ]; then
    echo "FAIL: no ferry package in $package (build ferry_python_package)"; exit 1
  fi
  stage=$(mktemp -d)
  trap 'rm -rf "$stage"' EXIT
  mkdir -p "$stage/python" "$stage/lib"
  cp -rL "$package/ferry" "$stage/python/"
  find "$stage/python" -name __pycache__ -prune -exec rm -rf {} +
  # Every library the extension loads, except glibc's own (the CUDA machine has those).
  for so in "$stage"/python/ferry/*.so*; do
    ldd "$so" | awk '/=> \// {print $3}'
  done | sort -u | grep -Ev '/(libc|libm|libdl|libpthread|librt|ld-linux[^/]*)\.so' |
    while read -r lib; do cp -L "$lib" "$stage/lib/"; done
  cp "$HERE/device_check.sh" "$HERE/python_sync.py" "$stage/"
  "$PYTHON" -c "import sysconfig; print(sysconfig.get_config_var('EXT_SUFFIX'))" \
    >"$stage/ext_suffix"
  tar -C "$stage" -czf "$out" .
  echo "bundle: $out ($(du -h "$out" | cut -f1); extension built for $(cat "$stage/ext_suffix"))"
  exit 0
fi

# Where ferry comes from: an unpacked bundle or a build tree's python folder.
if [ -f "$1" ]; then
  root=$(mktemp -d)
  trap 'rm -rf "$root"' EXIT
  tar -C "$root" -xzf "$1"
  package="$root/python"
  export LD_LIBRARY_PATH="$root/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  bench="$root/python_sync.py"
  want=$(cat "$root/ext_suffix")
  have=$("$PYTHON" -c "import sysconfig; print(sysconfig.get_config_var('EXT_SUFFIX'))")
  if [ "$want" != "$have" ]; then
    echo "FAIL: the bundle's extension is for $want, but $PYTHON loads $have: make the bundle" \
         "with the same Python version, or build ferry here"
    exit 3
  fi
else
  package=$(readlink -f "$1")
  bench="$HERE/python_sync.py"
fi
export PYTHONPATH="$package${PYTHONPATH:+:$PYTHONPATH}"

if ! reason=$("$PYTHON" -c "
import torch
if not torch.cuda.is_available():
    raise SystemExit(f'torch {torch.__version__} sees no CUDA device (built with CUDA '
                     f'{torch.version.cuda}; CUDA_VISIBLE_DEVICES='
                     f'{__import__(\"os\").environ.get(\"CUDA_VISIBLE_DEVICES\", \"unset\")})')
print(torch.cuda.get_device_name(0))" 2>&1); then
  echo "FAIL: no CUDA device usable here: ${reason##*$'\n'}"
  exit 2
fi
echo "device: $reason"
if ! err=$("$PYTHON" -c "import ferry" 2>&1); then
  echo "FAIL: cannot import ferry from $package: ${err##*$'\n'}"
  exit 3
fi

"$PYTHON" - <<'EOF'
import time

import torch

import ferry

DEVICE = "cuda:0"
specs = ferry.hf_tensor_specs("qwen2.5-0.5b", ferry.DType.BF16)
model = {n: torch.empty(s, dtype=torch.bfloat16, device=DEVICE).normal_() for n, _, s in specs}
total = sum(t.numel() * t.element_size() for t in model.values())


def rate(copy, reps: int = 3) -> float:
    """GB/s of copy() over the model's bytes: the best of `reps` after a warm-up."""
    copy()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        copy()
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t0)
    return total / best / 1e9


flat = torch.empty(total, dtype=torch.uint8, device=DEVICE)
pinned = torch.empty(total, dtype=torch.uint8, pin_memory=True)
pageable = torch.empty(total, dtype=torch.uint8).fill_(1)
print(f"model: {len(specs)} tensors, {total / 1e9:.3f} GB bf16")
print(f"torch D2H pinned   {rate(lambda: pinned.copy_(flat, non_blocking=True)):6.2f} GB/s")
print(f"torch D2H pageable {rate(lambda: pageable.copy_(flat)):6.2f} GB/s")
print(f"torch H2D pinned   {rate(lambda: flat.copy_(pinned, non_blocking=True)):6.2f} GB/s")
print(f"torch H2D pageable {rate(lambda: flat.copy_(pageable)):6.2f} GB/s")

pinned_d2h = rate(lambda: pinned.copy_(flat, non_blocking=True))
pinned_h2d = rate(lambda: flat.copy_(pinned, non_blocking=True))

# The device path's legs with its own code: the ring of a real ferry.Sender (2 slots of
# 512 MiB, registered as the master registers it) and the rollout's DeviceReceive.
from ferry._tensors import byte_view, host_view
from ferry.verl._device import device_for
from ferry.verl._device_path import DeviceReceive, RingRegistration

device = device_for(DEVICE)
BUCKET, SEGMENT = 512 << 20, 16 << 20
sender = ferry.Sender(f"@ferry-device-check-{time.monotonic_ns()}", bucket_bytes=BUCKET, slots=2)
address, nbytes = sender.ring_memory()
registration = RingRegistration(device, address, nbytes, read_only=False)
ring = host_view(address, nbytes)
print(f"ring: {nbytes >> 20} MiB, page-locked: {registration.registered}")
sources = [byte_view(t) for t in model.values()]


def d2h_into_ring() -> None:
    """Each tensor into the ring, in order, in pieces of at most a segment, waited for once
    per 16 MiB segment (as send_update's device copies and flush run)."""
    at = since_wait = 0
    for src in sources:
        for start in range(0, src.numel(), SEGMENT):
            piece = src[start:start + SEGMENT]
            n = piece.numel()
            if at + n > nbytes:
                at = 0
            device.copy_async(ring[at:at + n], piece)
            at += n
            since_wait += n
            if since_wait >= SEGMENT:
                device.synchronize()
                since_wait = 0
    device.synchronize()


d2h = rate(d2h_into_ring)
print(f"device path D2H into the ring  {d2h:6.2f} GB/s = {d2h / pinned_d2h:.2f} x torch pinned")

# The rollout's leg: the bytes laid out in buckets in the ring, each copied into a device
# buffer and viewed as its tensors (DeviceReceive._copy_bucket; the ring registered
# read-only there, as a receiver's is; here the sender's registration serves).
receive = DeviceReceive(device, BUCKET)
buckets, bucket, used = [], [], 0
for (name, tensor), src in zip(model.items(), sources):
    n = src.numel()
    assert n <= BUCKET, f"{name}: larger than a bucket (the receiver assembles it on the host)"
    if used + n > BUCKET and bucket:
        buckets.append(bucket)
        bucket, used = [], 0
    at = (len(buckets) % 2) * BUCKET + used
    view = memoryview(ring[at:at + n].numpy())
    bucket.append((name, ferry.DType.BF16, tuple(tensor.shape), view))
    used += n
buckets.append(bucket)


def h2d_from_ring() -> None:
    for i, b in enumerate(buckets):
        receive._copy_bucket(receive.buffers[i % 2], b)


h2d = rate(h2d_from_ring)
print(f"device path H2D from the ring  {h2d:6.2f} GB/s = {h2d / pinned_h2d:.2f} x torch pinned")
registration.release()
sender.close()
EOF

echo "checkpoint engine, colocated, CUDA tensors on both ends, engine_kwargs.ferry.device=cuda:0:"
"$PYTHON" "$bench" --paths backend --device "cuda:0" --bucket-mb 512 --rounds 3
