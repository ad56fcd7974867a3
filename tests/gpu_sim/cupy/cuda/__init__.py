"""Simulated ``cupy.cuda``: one device, streams and events that complete at once."""
import ctypes
import os
import types

_stack = []
current = [0]  # the current device


class Stream:
    _next = 1

    def __init__(self, null=False, non_blocking=False):
        self.ptr = 0 if null else Stream._next
        Stream._next += 1
        self.done = True

    def __enter__(self):
        _stack.append(self)
        return self

    def __exit__(self, *exc):
        _stack.pop()

    def wait_event(self, event):
        pass

    def synchronize(self):
        pass


_null = Stream(null=True)


def get_current_stream():
    return _stack[-1] if _stack else _null


class Event:
    #: Tests set this to make new events never complete (a stuck operation).
    stuck = False

    def __init__(self, block=False, disable_timing=False, interprocess=False):
        self._stuck = False

    def record(self, stream=None):
        self._stuck = Event.stuck

    @property
    def done(self):
        return not self._stuck


class Device:
    def __init__(self, index=0):
        self.id = index

    def use(self):
        current[0] = self.id

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass


def _memcpy(dst, src, nbytes, kind, stream):
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


runtime = types.SimpleNamespace(
    getDeviceCount=lambda: int(os.environ.get("SIM_CUPY_DEVICES", "1")),
    memcpyAsync=_memcpy, getDevice=lambda: 0, runtimeGetVersion=lambda: 0,
    driverGetVersion=lambda: 0, getDeviceProperties=_properties)


def alloc_pinned_memory(nbytes):
    return bytearray(nbytes)
