"""Simulated CuPy (tests only): host NumPy arrays behind a CuPy-like surface.

An array that owns its memory counts as a device allocation (``cuda.counts``); views
do not. During a stream capture an allocation, and a synchronous copy between host and
device (``get``, ``set``, ``asnumpy``), fail loudly (see ``cuda``).
"""
import numpy as _np

from . import cuda  # noqa: F401

SIMULATED = True
__version__ = "0.0-simulated"
int8, uint8, int16, uint16 = _np.int8, _np.uint8, _np.int16, _np.uint16
int32, uint32, int64, uint64 = _np.int32, _np.uint32, _np.int64, _np.uint64
float16, float32, float64 = _np.float16, _np.float32, _np.float64
complex64, complex128, bool_ = _np.complex64, _np.complex128, _np.bool_


def _unwrap(x):
    return x._a if isinstance(x, ndarray) else x


def _wrap(x):
    return ndarray(x) if isinstance(x, _np.ndarray) else x


class _Data:
    def __init__(self, a):
        self.ptr = a.ctypes.data if a.size else 0


class _Dev:
    def __init__(self, index):
        self.id = index


class ndarray:
    """A host array posing as a device array (``data.ptr`` is a host address)."""

    def __init__(self, a):
        if a.base is None:  # owns its memory: an allocation
            cuda.counts["allocations"] += 1
            if cuda.capture_here():
                cuda.forbidden("a device allocation")
        self._a = a
        self.device = _Dev(cuda.current[0])  # the device current when it was made

    dtype = property(lambda self: self._a.dtype)
    shape = property(lambda self: self._a.shape)
    size = property(lambda self: self._a.size)
    ndim = property(lambda self: self._a.ndim)
    nbytes = property(lambda self: self._a.nbytes)
    flags = property(lambda self: self._a.flags)

    @property
    def data(self):  # made once, as CuPy's (a stored attribute there)
        data = self.__dict__.get("_data")
        if data is None:
            data = self._data = _Data(self._a)
        return data

    def reshape(self, *shape):
        return ndarray(self._a.reshape(*shape))

    def view(self, dtype):
        return ndarray(self._a.view(dtype))

    def astype(self, dtype, copy=True):
        if not copy and self._a.dtype == dtype:
            return self
        return ndarray(self._a.astype(dtype, copy=copy))

    def copy(self):
        return ndarray(self._a.copy())

    def any(self):
        return self._a.any()

    def all(self):
        return self._a.all()

    def get(self, stream=None, out=None):
        if cuda.capture_here():
            cuda.forbidden("a device-to-host copy")
        if out is None:
            return self._a.copy()
        out[...] = self._a
        return out

    def set(self, arr, stream=None):
        if cuda.capture_here():
            cuda.forbidden("a host-to-device copy")
        self._a[...] = arr

    def __len__(self):
        return len(self._a)

    def __getitem__(self, idx):
        return _wrap(self._a[_unwrap(idx)])

    def __setitem__(self, idx, value):
        self._a[_unwrap(idx)] = _unwrap(value)

    def __repr__(self):
        return f"sim_cupy.ndarray({self._a!r})"


def _binary(name):
    def op(self, other):
        return _wrap(getattr(_np, name)(self._a, _unwrap(other)))
    return op


for _dunder, _ufunc in [("add", "add"), ("mul", "multiply"), ("truediv", "true_divide"),
                        ("lshift", "left_shift"), ("rshift", "right_shift"),
                        ("and", "bitwise_and"), ("or", "bitwise_or"), ("ne", "not_equal"),
                        ("eq", "equal")]:
    setattr(ndarray, f"__{_dunder}__", _binary(_ufunc))
ndarray.__hash__ = None


def _ufunc(name):
    def call(*args, out=None, **kwargs):
        result = getattr(_np, name)(*[_unwrap(a) for a in args],
                                    out=None if out is None else _unwrap(out), **kwargs)
        return out if out is not None else _wrap(result)
    return call


for _name in ("add", "multiply", "minimum", "maximum", "true_divide", "bitwise_and",
              "bitwise_or", "bitwise_xor"):
    globals()[_name] = _ufunc(_name)


def empty(shape, dtype=float):
    return ndarray(_np.empty(shape, dtype))


def zeros(shape, dtype=float):
    return ndarray(_np.zeros(shape, dtype))


def ones(shape, dtype=float):
    return ndarray(_np.ones(shape, dtype))


def asarray(x, dtype=None):
    return ndarray(_np.array(_unwrap(x), dtype=dtype))


array = asarray


def ascontiguousarray(x):
    return ndarray(_np.ascontiguousarray(_unwrap(x)))


def asnumpy(x):
    if cuda.capture_here():
        cuda.forbidden("a device-to-host copy")
    return _np.array(_unwrap(x))
