"""The warnings of TableBatchedEmbeddingBags' bounds_check="warn" mode: BoundsCheckWarning, the process's pool
of pinned host words a CUDA forward stores its count of dropped indices to, and each module's list of
reports not yet read.

On the CPU a call's count is known when it returns and warns there. On CUDA the step never waits for the
device: an eager forward has the device store its count to a pinned host word (HostWord), any other one
copies it to pinned memory behind an event; a later call of the module (or check_bounds()) reads the
reports the device has finished, in call order, and warns then. The functions taking a module keep their
state in its __dict__: ``_bounds_reports`` (the unread reports) and ``_bounds_free`` (the event path's
reusable buffers and events).
"""

import ctypes
import threading
import warnings
import weakref

import torch

from . import ops


class BoundsCheckWarning(UserWarning):
    """Indices outside their tables (or broken offsets) met by a TableBatchedEmbeddingBags in
    bounds_check="warn" mode. ``warnings.simplefilter("error", embscale.BoundsCheckWarning)`` turns
    the warnings into exceptions (raised when the report is read, possibly some calls later)."""


LOCK = threading.Lock()  # the report lists of every module and HOST_WORDS


class HostWord:
    """One int64 of pinned host memory that a warn-mode forward on CUDA has the device store its count
    of skipped indices to (tbe_forward's num_skipped_host). It holds PENDING until the device writes it, so
    a later call learns the count by reading host memory: no event and no copy on the stream."""
    PENDING = -(1 << 63)
    __slots__ = ("words", "i", "address", "device")

    def __init__(self, words, i):
        self.words, self.i, self.address, self.device = words, i, ctypes.addressof(words) + 8 * i, None

    def read(self):
        """The count, or None while the device has not written it."""
        value = self.words[self.i]
        return None if value == self.PENDING else value


class HostWords:
    """The process's pool of HostWords, taken and given back under LOCK. Words come in chunks of
    pinned memory (torch's pin_memory: cudaHostAlloc, which unified addressing maps for every device at
    the same address) that live as long as the process, so a word the device may still write never becomes
    someone else's memory. A word goes back to the pool only once its count has been read; the pending
    words of a module that is gone once the device has written them; a word whose call failed after the
    launch never. A device whose library call refuses the words (pinned memory that is not mapped at its
    host address) is not offered them again."""
    CHUNK = 64

    def __init__(self):
        self.free, self.chunks, self.refused = [], [], set()
        self.orphans = []  # words of modules that are gone, given back once the device has written them
        self.inbox = []  # where a module's finalizer leaves them (without the lock: it may run under it)

    def take(self, device):
        if device in self.refused:
            return None
        if self.inbox:  # (list slicing and deletion are each atomic; the finalizer only appends)
            arrived = self.inbox[:]
            del self.inbox[:len(arrived)]
            self.orphans.extend(arrived)
        if self.orphans:
            waiting = []
            for w in self.orphans:
                (waiting if w.read() is None else self.free).append(w)
            self.orphans = waiting
        if not self.free:
            chunk = torch.empty(self.CHUNK, dtype=torch.int64, pin_memory=True)
            words = (ctypes.c_int64 * self.CHUNK).from_address(chunk.data_ptr())
            self.chunks.append(chunk)
            self.free.extend(HostWord(words, i) for i in range(self.CHUNK))
        word = self.free.pop()
        word.words[word.i] = HostWord.PENDING
        word.device = device
        return word

    def give_back(self, word):
        self.free.append(word)

    def orphan(self, reports):
        """The words among a deleted module's pending reports (weakref.finalize of the module). Takes no
        lock: a collection may run it while this thread holds LOCK."""
        self.inbox.extend([r for r in reports if isinstance(r, HostWord)])


HOST_WORDS = HostWords()


class CountTargets:
    """Where an eager skip- or warn-mode forward of the module stores its count of skipped indices: the
    module's ``num_skipped`` buffer (None where it cannot be written in place) and, in warn mode on CUDA, a
    pinned host word (HostWord). ``written`` says the forward did so (an eager call; ``tensor`` is then the
    count's tensor, the buffer where one was given); otherwise the count comes back from the operator and the
    module copies it into its buffer."""
    __slots__ = ("buffer", "word", "written", "tensor")

    def __init__(self, buffer, word):
        self.buffer, self.word, self.written, self.tensor = buffer, word, False, None

    def give_back_word(self):
        """The word back to the pool: the call that took it ended before the library could write it (refused
        by the checks before the launch), or without it."""
        if self.word is not None:
            with LOCK:
                HOST_WORDS.give_back(self.word)
            self.word = None

    def refuse_word(self):
        """The library refused the word (pinned memory its device does not see at the host address): its
        device is not offered words again, and this call counts on its own (reported behind an event)."""
        with LOCK:
            HOST_WORDS.refused.add(self.word.device)
            HOST_WORDS.give_back(self.word)
        self.word = self.buffer = None


def count_targets(module):
    """Where an eager forward stores its count (CountTargets). The num_skipped buffer, written in place,
    where it is what the module made (one int64 on the tables' device) and may be written (not an
    inference tensor outside inference mode); in warn mode on the current CUDA device, outside a graph
    capture, a pinned host word too. A warn call without a word (on the CPU, or on CUDA where none is
    taken) warns from a count tensor of its own, copied into the buffer afterwards: the buffer is shared
    by every call of the module, and another thread's call (or, on CUDA, a later one before the copy
    behind its event runs) may overwrite it before this call's warning reads it."""
    buffer = module.num_skipped
    dev = buffer.device
    if (buffer.dtype != torch.int64 or buffer.numel() != 1 or buffer.layout != torch.strided
            or dev != module.weights.device or (buffer.is_inference() and not torch.is_inference_mode_enabled())):
        buffer = None
    word = None
    if (module.bounds_check == "warn" and dev.type == "cuda" and dev.index == torch.cuda.current_device()
            and not torch.cuda.is_current_stream_capturing()):
        with LOCK:
            word = HOST_WORDS.take(dev)
    if module.bounds_check == "warn" and word is None:
        buffer = None
    return CountTargets(buffer, word)


def warn_skipped(count: int, when: str, stacklevel: int):
    if count > 0:
        warnings.warn(f"bounds_check='warn': {count} indices outside their tables were dropped in {when} (they "
                      "added nothing to their bags); bounds_check='error' raises IndexError naming the feature, "
                      "bag and position", BoundsCheckWarning, stacklevel=stacklevel)
    elif count < 0:
        warnings.warn(f"bounds_check='warn': offsets were broken in {when} (decreasing, or not ending at the "
                      "number of indices): each bag was clamped into the indices and no table row was updated "
                      "(the step still advanced; dense mode gave no gradient, per-sample weights a zero one); "
                      "bounds_check='error' raises IndexError naming the offset", BoundsCheckWarning,
                      stacklevel=stacklevel)


def _pending_reports(module):
    """The module's list of unread reports (under LOCK). Made with a finalizer that hands its host words to
    the pool when the module is gone."""
    pending = module.__dict__.get("_bounds_reports")
    if pending is None:
        pending = module.__dict__["_bounds_reports"] = []
        weakref.finalize(module, HOST_WORDS.orphan, pending).atexit = False
    return pending


def note_bounds(module, num_skipped: torch.Tensor, word=None):
    """Reports a warn-mode call's count (called by the module's forward: the stack levels count from the
    module's caller). A CPU count is known now. A CUDA one is read by a later call once the device has
    written it (never waiting): from the pinned host word the forward had the device store it to (eager
    calls), else from pinned memory it is copied to behind an event on the stream that produced it (the
    current stream of the tables' device). Under compile, tracing, fake or meta tensors, a transform or a
    CUDA graph capture the count stays in num_skipped only."""
    if word is not None:
        with LOCK:
            _pending_reports(module).append(word)
        read_bounds_reports(module, wait=False, stacklevel=7)
        return
    if not ops.real_tensors(num_skipped):
        return
    if num_skipped.device.type == "cpu":
        warn_skipped(int(num_skipped.item()), "this call", 6)  # at the module call
        return
    dev = num_skipped.device
    if dev.index == torch.cuda.current_device():  # (switching to the current device costs two calls)
        queued = _queue_bounds_report(module, num_skipped)
    else:
        with torch.cuda.device(dev):
            queued = _queue_bounds_report(module, num_skipped)
    if queued is None:
        return
    with LOCK:
        _pending_reports(module).append(queued)
    read_bounds_reports(module, wait=False, stacklevel=7)


def _queue_bounds_report(module, num_skipped: torch.Tensor):
    """(host, event, device): the count copied to pinned memory behind an event on the current stream of
    its device (the current device); None inside a CUDA graph capture."""
    if torch.cuda.is_current_stream_capturing():
        return None
    dev = num_skipped.device
    with LOCK:  # threads may share a module; a read report's buffer and event are reused
        free = module.__dict__.setdefault("_bounds_free", [])
        host, event, _ = free.pop() if free and free[-1][2] == dev else (
            torch.empty(1, dtype=torch.int64, pin_memory=True), torch.cuda.Event(), dev)
    host.copy_(num_skipped, non_blocking=True)
    event.record()
    return host, event, dev


def read_bounds_reports(module, wait: bool, stacklevel: int):
    """Warns of the module's reports that the device has finished, in call order (wait: of all of them,
    waiting for their devices)."""
    counts = []
    waited = set()  # unwritten words whose devices finished their work first, outside the lock
    if wait:
        with LOCK:
            waited = {r for r in module.__dict__.get("_bounds_reports", ())
                      if isinstance(r, HostWord) and r.read() is None}
        for dev in {w.device for w in waited}:
            torch.cuda.synchronize(dev)
    with LOCK:
        pending = module.__dict__.get("_bounds_reports", [])
        while pending:
            if isinstance(pending[0], HostWord):
                word = pending[0]
                count = word.read()
                if count is None and word not in waited:
                    break  # not written yet (or queued by another thread since the wait)
                pending.pop(0)
                if count is not None:  # (None after its device's work: a call whose kernels never ran)
                    counts.append(count)
                    HOST_WORDS.give_back(word)
                continue
            host, event, _ = pending[0]
            if wait:
                event.synchronize()
            elif not event.query():
                break
            counts.append(int(host[0]))
            free = module.__dict__.setdefault("_bounds_free", [])
            if len(free) < 4:
                free.append(pending[0])
            pending.pop(0)
    for count in counts:
        warn_skipped(count, "an earlier call", stacklevel)
