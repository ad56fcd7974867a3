"""Simulated ``cupy.cuda``: one device, streams and events that complete at once.

Two things a real GPU makes costly or illegal are made countable here, for tests:

* :data:`counts`: streams and events created, device arrays allocated (an array that
  owns its memory), event records, stream waits and event queries, so a test can say
  "after warm-up, a call creates no event and allocates nothing";
* **stream capture** (CUDA graphs): ``Stream.begin_capture()`` / ``end_capture()`` /
  ``is_capturing()``. While a stream captures, what CUDA refuses during a capture
  fails loudly: it is appended to :data:`violations` and raises ``RuntimeError``. In
  the capturing thread: a host synchronization (stream, event, device), an event or
  stream query, a device or pinned allocation, a synchronous copy between host and
  device, and work on the legacy (null) stream; from any thread: a query or
  synchronization of an event recorded during the capture. Work enqueued on a
  capturing stream is still done at once (host memory), and its name is appended to
  that stream's ``captured`` list; ``end_capture()`` returns a :class:`Graph` of those
  names, whose ``launch()`` does nothing.
"""
import ctypes
import os
import threading
import types
import weakref

_stack = []
current = [0]  # the current device

#: What was made or done, for tests (reset with :func:`reset_counts`).
counts = {"streams": 0, "events": 0, "allocations": 0, "records": 0, "waits": 0,
          "queries": 0}
#: Each call CUDA would have refused during a capture, in words.
violations = []
_capturing = {}                           # ptr of a capturing stream -> capturing thread
_streams = weakref.WeakValueDictionary()  # ptr -> Stream


def reset_counts():
    for key in counts:
        counts[key] = 0


def capture_here():
    """Whether the calling thread has a stream capture in progress."""
    return bool(_capturing) and threading.get_ident() in _capturing.values()


def forbidden(what):
    """Record and raise a call CUDA refuses during a stream capture."""
    message = (f"simulated CUDA: {what} during a stream capture (CUDA refuses it and "
               f"invalidates the capture)")
    violations.append(message)
    raise RuntimeError(message)


def enqueued(stream_ptr, name):
    """Note work ``name`` enqueued on the stream ``stream_ptr`` (NCCL calls, copies)."""
    if not _capturing:
        return
    stream = _streams.get(stream_ptr)
    if stream is not None and stream_ptr in _capturing:
        stream.captured.append(name)
    elif stream_ptr == 0 and capture_here():
        forbidden(f"{name} on the legacy stream")


class Graph:
    """What a capture recorded (names only; the simulation ran it when enqueued)."""

    def __init__(self, captured):
        self.captured = captured

    def launch(self, stream=None):
        pass


class Stream:
    _next = 1

    def __init__(self, null=False, non_blocking=False, ptr=None):
        counts["streams"] += 1
        if ptr is not None:
            self.ptr = ptr
        else:
            self.ptr = 0 if null else Stream._next
            Stream._next += 1
        self.captured = []
        _streams[self.ptr] = self

    def __eq__(self, other):
        return isinstance(other, Stream) and other.ptr == self.ptr

    def __hash__(self):
        return self.ptr

    def __enter__(self):
        _stack.append(self)
        return self

    def __exit__(self, *exc):
        _stack.pop()

    @property
    def done(self):
        if capture_here() or self.ptr in _capturing:
            forbidden("a stream query")
        return True

    def wait_event(self, event):
        counts["waits"] += 1
        enqueued(self.ptr, "wait_event")

    def record(self, event=None):
        event = Event() if event is None else event
        event.record(self)
        return event

    def synchronize(self):
        if capture_here() or self.ptr in _capturing:
            forbidden("a stream synchronization")

    def is_capturing(self):
        return self.ptr in _capturing

    def begin_capture(self, mode=None):
        if self.ptr == 0:
            raise RuntimeError("cannot capture on the default (legacy) stream")
        _capturing[self.ptr] = threading.get_ident()
        self.captured = []

    def end_capture(self):
        del _capturing[self.ptr]
        return Graph(list(self.captured))


def ExternalStream(ptr, device_id=-1):  # noqa: N802 (CuPy's name)
    """The stream of handle ``ptr`` (the same object where the simulation made one)."""
    found = _streams.get(ptr)
    return found if found is not None else Stream(ptr=ptr)


_null = Stream(null=True)


def get_current_stream():
    return _stack[-1] if _stack else _null


class Event:
    #: Tests set this to make new events never complete (a stuck operation).
    stuck = False

    def __init__(self, block=False, disable_timing=False, interprocess=False):
        counts["events"] += 1
        self._stuck = False
        self._captured = False

    def record(self, stream=None):
        counts["records"] += 1
        stream = get_current_stream() if stream is None else stream
        enqueued(stream.ptr, "record")
        self._stuck = Event.stuck
        self._captured = stream.is_capturing()

    def _check(self, what):
        if capture_here() or (self._captured and _capturing):
            forbidden(what)

    @property
    def done(self):
        counts["queries"] += 1
        self._check("an event query")
        return not self._stuck

    def synchronize(self):
        self._check("an event synchronization")


class Device:
    def __init__(self, index=0):
        self.id = index

    def use(self):
        current[0] = self.id

    def synchronize(self):
        if capture_here():
            forbidden("a device synchronization")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass


def _memcpy(dst, src, nbytes, kind, stream):
    enqueued(stream, "memcpyAsync")
    ctypes.memmove(dst, src, nbytes)


#: Device index -> the UUID (16 bytes) ``getDeviceProperties`` reports for it. Empty by
#: default: no UUID, as with a CuPy that cannot read one. Tests set it per rank (the same
#: bytes on two ranks: they share a GPU).
uuids = {}


def _properties(index):
    props = {"name": b"simulated", "totalGlobalMem": 1 << 30}
    if index in uuids:
        props["uuid"] = uuids[index]
    return props


def _device_synchronize():
    if capture_here():
        forbidden("a device synchronization")


runtime = types.SimpleNamespace(
    getDeviceCount=lambda: int(os.environ.get("SIM_CUPY_DEVICES", "1")),
    memcpyAsync=_memcpy, getDevice=lambda: 0, runtimeGetVersion=lambda: 0,
    driverGetVersion=lambda: 0, getDeviceProperties=_properties,
    deviceSynchronize=_device_synchronize, streamCaptureModeGlobal=0,
    streamCaptureModeThreadLocal=1, streamCaptureModeRelaxed=2)


def alloc_pinned_memory(nbytes):
    if capture_here():
        forbidden("a pinned host allocation")
    return bytearray(nbytes)
