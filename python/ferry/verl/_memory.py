"""Host buffers backed in bulk when they are created, for memory reused by every update."""

from __future__ import annotations

import ctypes
import mmap

import torch

_PAGE = mmap.PAGESIZE
_MADV_HUGEPAGE = getattr(mmap, "MADV_HUGEPAGE", 14)
_MADV_POPULATE_WRITE = getattr(mmap, "MADV_POPULATE_WRITE", 23)  # Linux 5.14+
# ctypes releases the GIL around the call (mmap.madvise holds it for the whole populate).
_libc = ctypes.CDLL(None, use_errno=True)
_libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]


def backed_buffer(nbytes: int) -> torch.Tensor:
    """A uint8 tensor of `nbytes` (zeros) whose pages are all backed now, in bulk.

    A buffer's first touch otherwise faults it in one page at a time: on a VM whose
    hypervisor backs guest memory lazily that cost 7-10 s per GiB (qwen2.5-0.5b's first
    update spent most of its time there), against 1.5-3.5 s for the same memory mapped with
    transparent huge pages where allowed, populated by one madvise, then stored to once per
    page from this process (base/prefault.h says why the stores are needed). Either madvise
    may fail (an older kernel, THP off): the stores back the pages all the same.
    """
    size = max(-(-int(nbytes) // _PAGE) * _PAGE, _PAGE)
    memory = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    tensor = torch.frombuffer(memory, dtype=torch.uint8)  # keeps `memory` alive
    for advice in (_MADV_HUGEPAGE, _MADV_POPULATE_WRITE):
        _libc.madvise(tensor.data_ptr(), size, advice)
    tensor[::_PAGE].fill_(0)
    return tensor[:nbytes]


def copied_into(raw: torch.Tensor, tensor: torch.Tensor) -> torch.Tensor:
    """`tensor` copied into `raw` (a uint8 tensor of exactly its bytes, its start aligned for
    its dtype): the copy, with the tensor's dtype and shape."""
    view = raw.view(tensor.dtype).view(tensor.shape)
    if tensor.numel():
        view.copy_(tensor)
    return view
