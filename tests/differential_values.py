"""The differential harness's inputs and references: what each rank puts in for a
dtype, a reduction and a group size, drawn from a seed so that every rank can make every
other rank's input, and the exact result NumPy gives for them (``tests/differential.py``
runs the sequences that use them).
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

import numpy as np


#: dtype names (bfloat16 from ml_dtypes, when installed)
DTYPES = ["bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64",
          "float16", "bfloat16", "float32", "float64", "complex64", "complex128"]
#: Reductions per family, as torch defines them.
REDUCTIONS = {
    "bool": ["SUM", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR"],
    "int": ["SUM", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR"],
    "float": ["SUM", "PRODUCT", "MIN", "MAX", "AVG", "PREMUL_SUM"],
    "complex": ["SUM", "AVG", "PREMUL_SUM"],
}
#: A reduction each family lacks, and what the error says.
UNDEFINED = {"bool": ("AVG", "floating"), "int": ("AVG", "floating"),
             "float": ("BXOR", "bitwise"), "complex": ("MAX", "complex")}
#: Bytes of a "large" operation at most (all ranks' inputs are made on every rank).
LARGE = 9 << 20
#: Elements drawn at random per input; longer inputs repeat them (a prime: a block that
#: lands in the wrong place shows).
PERIOD = 4099
PREMUL_FACTOR = 0.5


def family(dtype: np.dtype) -> str:
    if dtype.kind == "b":
        return "bool"
    if dtype.kind in "iu":
        return "int"
    return "complex" if dtype.kind == "c" else "float"


class Failure(AssertionError):
    """A result or an error that differs from the reference."""


# -- inputs and references ------------------------------------------------------------------
def values(dtype: np.dtype, count: int, seed: int, rank: int, red: Optional[str],
           size: int) -> np.ndarray:
    """Rank ``rank``'s input: the same on every rank that asks, exact to reduce by ``red``
    over ``size`` ranks in any order."""
    rng = np.random.default_rng([seed, rank])
    drawn = min(count, PERIOD)  # drawn once, repeated: large inputs stay cheap to make
    return np.resize(_draw(rng, dtype, drawn, red, size), count)


def _draw(rng: np.random.Generator, dtype: np.dtype, count: int, red: Optional[str],
          size: int) -> np.ndarray:
    fam = family(dtype)
    if fam == "bool":
        return rng.integers(0, 2, count).astype(bool)
    if fam == "int":
        info = np.iinfo(dtype)
        if red == "PRODUCT":  # wrapping products of small factors (signed: no overflow)
            choices = [1, 2, 3] if info.min == 0 else [-1, 1]
            return rng.choice(np.array(choices, dtype), count)
        if red in ("SUM", None) and info.min < 0:  # signed sums stay in range
            bound = info.max // max(size, 1)
            return rng.integers(-bound, bound, count, dtype=dtype, endpoint=True)
        return rng.integers(info.min, info.max, count, dtype=dtype, endpoint=True)
    if red == "PRODUCT":  # powers of two: exact products (within float16's range)
        factors = [-1.0, -0.5, 0.5, 1.0] if dtype.itemsize == 2 else [-2.0, -1.0, 0.5, 2.0]
        real = rng.choice(np.array(factors), count)
    elif red in ("MIN", "MAX", None):
        real = rng.standard_normal(count) * 100
        if red is not None:  # a NaN now and then: it must win, as in NumPy and torch
            real[rng.random(count) < 0.02] = np.nan
    else:  # sums: small integers
        real = rng.integers(-8, 8, count, endpoint=True).astype(np.float64)
    if fam == "complex":
        imag = rng.integers(-8, 8, count, endpoint=True).astype(np.float64)
        return (real + 1j * imag).astype(dtype)
    return real.astype(dtype)


def reference(inputs: Sequence[np.ndarray], red: str) -> np.ndarray:
    """The exact reduction of ``inputs`` (one per rank), in ``inputs[0]``'s dtype."""
    dtype = inputs[0].dtype
    fam = family(dtype)
    if fam == "bool":
        fn = {"SUM": np.logical_or, "MAX": np.logical_or, "BOR": np.logical_or,
              "PRODUCT": np.logical_and, "MIN": np.logical_and, "BAND": np.logical_and,
              "BXOR": np.logical_xor}[red]
    else:
        fn = {"SUM": np.add, "AVG": np.add, "PREMUL_SUM": np.add, "PRODUCT": np.multiply,
              "MIN": np.minimum, "MAX": np.maximum, "BAND": np.bitwise_and,
              "BOR": np.bitwise_or, "BXOR": np.bitwise_xor}[red]
    wide = {"int": None, "bool": None, "float": np.float64, "complex": np.complex128}[fam]
    rows = [x.astype(wide) if wide is not None else x for x in inputs]
    if red == "PREMUL_SUM":
        rows = [x * PREMUL_FACTOR for x in rows]
    out = rows[0].copy()
    with np.errstate(over="ignore"):
        for row in rows[1:]:
            fn(out, row, out=out)
    if red == "AVG":
        out = out / len(inputs)
    return out.astype(dtype)


def exact(dtype: np.dtype, red: Optional[str], size: int) -> bool:
    """Whether the result is exact, so any path must give it bit for bit: all but AVG
    over a group whose size is not a power of two (a quotient, rounded)."""
    return red != "AVG" or size & (size - 1) == 0


def check(got: Any, want: np.ndarray, exact_bits: bool, what: str) -> None:
    got = np.asarray(got)
    if got.dtype != want.dtype or got.shape != want.shape:
        raise Failure(f"{what}: got {got.dtype}{list(got.shape)}, want "
                      f"{want.dtype}{list(want.shape)}")
    if exact_bits:
        same = np.array_equal(np.ascontiguousarray(got).view(np.uint8),
                              np.ascontiguousarray(want).view(np.uint8))
    else:
        wide = np.complex128 if want.dtype.kind == "c" else np.float64
        same = np.allclose(got.astype(wide), want.astype(wide), rtol=1e-2 if
                           want.dtype.itemsize <= 2 else 1e-6, atol=0)
    if not same:
        equal = np.asarray(got == want)
        if want.dtype.kind not in "biu":  # NaN in both places is no difference
            equal |= np.isnan(got.astype(np.complex128)) & np.isnan(want.astype(np.complex128))
        bad = np.flatnonzero(~equal.reshape(-1))
        at = int(bad[0]) if bad.size else 0
        raise Failure(f"{what}: {bad.size} of {want.size} elements differ from NumPy's "
                      f"(first at {at}: got {got.reshape(-1)[at]!r}, want "
                      f"{want.reshape(-1)[at]!r})")
