"""Host memory for the CPU tables: large buffers on transparent huge pages.

Every lookup of a CPU TBE reads a row at a random place in tables of tens to hundreds of megabytes. On 4 KiB
pages nearly every such read also misses the TLB and walks the page tables; on 2 MiB pages a core's TLB
covers gigabytes. So from 2 MiB up the module's CPU tables and optimizer state live on an anonymous private
mapping whose interior is 2 MiB-aligned and advised MADV_HUGEPAGE before anything touches it: under Linux's
default transparent-huge-page policy ("madvise", as on Debian and Ubuntu) and under "always" the first
writes fault in huge pages. Under "never", off Linux, or when the mapping fails, the buffer is an ordinary
``torch.empty``; nothing else changes (same dtype, shape, contiguity; the tensor owns its memory, which is
unmapped when the last tensor using it is freed). Measured in docs/tbe_cpu.md ("Huge pages").
"""

import ctypes
import mmap
import sys

import torch

HUGE_PAGE_BYTES = 2 << 20


def huge_pages_available() -> bool:
    """Whether this platform can advise a mapping for transparent huge pages."""
    return sys.platform.startswith("linux") and hasattr(mmap, "MADV_HUGEPAGE") and hasattr(mmap, "MAP_PRIVATE")


def empty(numel: int, dtype: torch.dtype) -> torch.Tensor:
    """An uninitialised contiguous CPU tensor [numel] of dtype; from HUGE_PAGE_BYTES up on memory advised for
    huge pages (see the module docstring), else from torch's allocator."""
    nbytes = numel * torch.empty(0, dtype=dtype).element_size()
    if nbytes < HUGE_PAGE_BYTES or not huge_pages_available():
        return torch.empty(numel, dtype=dtype)
    try:
        mapping = mmap.mmap(-1, nbytes + HUGE_PAGE_BYTES, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        anchor = ctypes.c_char.from_buffer(mapping)
        offset = -ctypes.addressof(anchor) % HUGE_PAGE_BYTES
        del anchor  # a live export would keep the mapping from ever being closed
        mapping.madvise(mmap.MADV_HUGEPAGE)
    except (OSError, ValueError):
        return torch.empty(numel, dtype=dtype)
    # The tensor's storage keeps the mapping alive (and unmaps it when freed). Untouched pages outside
    # [offset, offset + nbytes) are never faulted in.
    return torch.frombuffer(mapping, dtype=dtype, count=numel, offset=offset)
