#!/usr/bin/env python3
"""What handing an update to the sender from a coroutine costs per tensor: 290 tensors of 4 KiB
(qwen2.5-0.5b's count, too small for the copy to matter) through one Sender into a Receiver
thread of the same process, per round:

    PYTHONPATH=build/python .venv/bin/python bench/python_handover.py [--rounds 15]
        [--paths sync,round,update,device]

  sync    Sender.send_round_streamed: the iterator pulled on the caller's thread (the floor)
  round   Sender.send_round_streamed_async: pulled on the event loop, each tensor copied by
          the update's own thread before the next is pulled
  update  Sender.send_update_async, the verl backend's path (streamed after the first)
  device  the same with device=ferry.verl's CPU Device: each tensor put as a producer whose
          copies the device makes (the verl backend's device path, here with synchronous
          CPU copies), one GIL-taking call per piece and a flush per segment

Prints the median, min and max milliseconds per round after one warm-up. Run two builds side
by side (PYTHONPATH=<other build>/python) to compare hand-overs: the machine's load moves the
figures several-fold between runs, not between builds run back to back.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import threading
import time
import uuid

import numpy as np
import torch

import ferry
from ferry.verl._device import Device

TENSORS, SIZE = 290, 4096


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--paths", default="sync,round,update,device")
    args = parser.parse_args()
    weights = [(f"t{i}", np.full(SIZE, i % 251, dtype=np.uint8)) for i in range(TENSORS)]
    specs = [(name, "U8", (SIZE,)) for name, _ in weights]
    on_device = [(name, torch.from_numpy(array)) for name, array in weights]
    device = Device("cpu")
    address = "@ferry-handover-" + uuid.uuid4().hex[:8]
    with ferry.Sender(address, bucket_bytes=64 << 20) as sender:
        joined: list = []
        t = threading.Thread(target=lambda: joined.append(ferry.Receiver(address, 0)))
        t.start()
        sender.accept(1)
        t.join()
        receiver = joined[0]

        def receive(updates: int) -> None:
            for _ in range(updates):
                while receiver.receive_round(lambda name, tensor: None).more_follows:
                    pass

        async def send(path: str) -> None:
            if path == "sync":
                sender.send_round_streamed(specs, iter(weights))
            elif path == "round":
                await sender.send_round_streamed_async(specs, iter(weights))
            elif path == "update":
                await sender.send_update_async(iter(weights))
            else:
                await sender.send_update_async(iter(on_device), device=device)

        async def timed(path: str) -> list[float]:
            times = []
            for k in range(args.rounds + 1):
                start = time.perf_counter()
                await send(path)
                if k:
                    times.append((time.perf_counter() - start) * 1e3)
            return times

        for path in args.paths.split(","):
            rx = threading.Thread(target=receive, args=(args.rounds + 1,))
            rx.start()
            times = asyncio.run(timed(path))
            rx.join()
            print(f"{path:7s} median {statistics.median(times):5.1f} ms per round "
                  f"(min {min(times):.1f}, max {max(times):.1f})")
        receiver.close()


if __name__ == "__main__":
    main()
