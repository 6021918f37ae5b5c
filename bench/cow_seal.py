#!/usr/bin/env python3
"""What sealing a writable-views slot costs (issue 31 item 7), beside a copy of the same bytes.

    .venv/bin/python bench/cow_seal.py [--slot-mb 512] [--repeat 10]

A receiver's copy-on-write view of the ring (src/transport/shm/cow_view.cc) seals a released
slot read-only (mprotect PROT_READ, in the background before the slot's scan) and unseals it
when the slot's next bucket is handed out (PROT_READ|PROT_WRITE, on the path). This maps a
memfd privately as CowView does, faults it in by reading (the state after a scan), and times
each call against one memcpy of the slot into it, in the same run. Figures: best of --repeat.
"""

import argparse
import ctypes
import mmap
import os
import time

PROT_READ, PROT_WRITE = 1, 2


def best(f, repeat):
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        f()
        times.append(time.perf_counter() - t)
    return min(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--slot-mb", type=int, default=512)
    ap.add_argument("--repeat", type=int, default=10)
    args = ap.parse_args()
    size = args.slot_mb << 20
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    fd = os.memfd_create("ferry-bench-ring")
    os.ftruncate(fd, size)
    ring = mmap.mmap(fd, size)
    ring.write(b"\x01" * size)
    view = mmap.mmap(fd, size, flags=mmap.MAP_PRIVATE, prot=PROT_READ | PROT_WRITE)
    addr = ctypes.addressof((ctypes.c_char * size).from_buffer(view))
    source = ctypes.addressof((ctypes.c_char * size).from_buffer(ring))
    page = os.sysconf("SC_PAGE_SIZE")
    target = (ctypes.c_char * size).from_address(addr)
    for off in range(0, size, page):
        _ = target[off]

    def protect(prot):
        if libc.mprotect(addr, size, prot) != 0:
            raise OSError(ctypes.get_errno(), "mprotect")

    seal, unseal = [], []
    for _ in range(args.repeat):
        t = time.perf_counter()
        protect(PROT_READ)
        seal.append(time.perf_counter() - t)
        t = time.perf_counter()
        protect(PROT_READ | PROT_WRITE)
        unseal.append(time.perf_counter() - t)
    copy_into = ctypes.create_string_buffer(size)  # a copy elsewhere: the view stays clean
    copy = best(lambda: ctypes.memmove(copy_into, source, size), args.repeat)
    print(f"slot {args.slot_mb} MiB: memcpy {copy * 1e3:.1f} ms; seal {min(seal) * 1e3:.2f} ms "
          f"(background); unseal {min(unseal) * 1e3:.2f} ms (on the path) = "
          f"{min(unseal) / copy:.3f} of the memcpy")

if __name__ == "__main__":
    main()
