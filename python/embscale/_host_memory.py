"""Host memory for the CPU tables: large buffers on transparent huge pages; and the host store of tables that
train on CUDA through a row cache (``host_store``).

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
import weakref

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


# Base addresses of the live host-store allocations (host_store), which need no registration with CUDA.
_HOST_STORES = set()


def host_store(numel: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """An uninitialised contiguous CPU tensor [numel] of dtype in memory that kernels on CUDA `device` read and
    write in place (the library's host_store_malloc: managed memory kept on the host and mapped for the
    device, as FBGEMM's UVM tables; rows scattered over it move at the host link's rate, where rows of pinned
    or registered memory move at under half that: docs/tbe_cache.md). The tensor owns the memory, which is
    freed when the last tensor using it is."""
    from . import _capi  # (the native library; this module also serves CPU-only callers)

    nbytes = numel * torch.empty(0, dtype=dtype).element_size()
    if nbytes == 0:
        return torch.empty(0, dtype=dtype)
    out = ctypes.c_void_p()
    with torch.cuda.device(device):
        rc = _capi.lib.embscale_host_store_malloc(nbytes, ctypes.byref(out))
    _capi.check(rc)
    ptr = out.value
    owner = (ctypes.c_uint8 * nbytes).from_address(ptr)
    _HOST_STORES.add(ptr)
    weakref.finalize(owner, _free_host_store, ptr)
    # torch.frombuffer keeps `owner` alive while any tensor uses the memory.
    return torch.frombuffer(owner, dtype=dtype, count=numel)


def _free_host_store(ptr):
    from . import _capi

    _HOST_STORES.discard(ptr)
    _capi.lib.embscale_host_store_free(ptr)


def is_host_store(t: torch.Tensor) -> bool:
    """Whether t lives in memory from host_store (mapped for CUDA already)."""
    return t.device.type == "cpu" and t.untyped_storage().data_ptr() in _HOST_STORES
