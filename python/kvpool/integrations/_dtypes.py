"""torch dtype helpers the connectors share."""

import functools

import torch

_PREFIX = "torch."


def dtype_name(dtype) -> str:
    """A dtype's name without the module: torch.bfloat16 -> "bfloat16". A
    string that already is a name ("auto", "fp8") is returned as it is."""
    s = str(dtype)
    return s[len(_PREFIX):] if s.startswith(_PREFIX) else s


@functools.lru_cache(maxsize=None)
def element_size(dtype: torch.dtype) -> int:
    """Bytes per element (torch 1.13 has no dtype.itemsize)."""
    return torch.empty((), dtype=dtype).element_size()
