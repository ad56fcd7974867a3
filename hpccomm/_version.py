__version__ = "0.1.0"

#: The torch releases (major.minor) hpccomm's PyTorch backend is tested on: what
#: ``hpccomm[torch]`` installs, what ``hpccomm info`` and ``import hpccomm.torch`` check.
TESTED_TORCH = ("2.13", "2.14", "2.15")


def torch_release(version: str) -> str:
    """``"2.14"`` for ``"2.14.1+cu130"``."""
    return ".".join(version.split("+")[0].split(".")[:2])


def torch_tested(version: str) -> bool:
    """Whether torch ``version`` is one of the tested releases."""
    return torch_release(version) in TESTED_TORCH


def tested_torch_text() -> str:
    """The tested releases in words: ``"2.13, 2.14 and 2.15"``."""
    *first, last = TESTED_TORCH
    return f"{', '.join(first)} and {last}" if first else last
