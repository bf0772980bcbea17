"""How the CPU kernels are declared for numba's disk cache.

`cached` is numba's njit, cached on disk; `specialize` and `per_type` make one cached kernel per
GGUF type out of one template, `parallel_and_serial` a serial twin for a few rows. numba's cache
only notices edits to the file that defines a cached kernel: after editing a helper the kernels
of another module inline (ir.py, blocks.py, matvec.py, scalar.py, q8.py...), clear __pycache__.
"""

from __future__ import annotations

import types as pytypes

from gguf import GGMLQuantizationType
from numba import njit


def cached(**options):
    """numba's njit, cached on disk (options as njit's; cache=False leaves a kernel uncached)."""
    return njit(**{"cache": True, **options})


def specialize(template, name: str, constants: dict, **options):
    """A cached kernel compiled from a copy of `template` named `name`, whose globals also hold
    `constants` (a type's row dot, decoder...: numba freezes them into the compiled code). numba
    caches a function by its file, name and bytecode, so each copy has its own cache entry. The
    copy sees the module's globals as they are now: call this below whatever the template uses."""
    scope = {**template.__globals__, **constants}
    fn = pytypes.FunctionType(template.__code__, scope, name, template.__defaults__)
    fn.__qualname__ = name
    return cached(**options)(fn)


def per_type(template, prefix: str, constants: dict[str, dict], **options) -> dict[int, object]:
    """{ggml type id: kernel} for GGUF type names mapped to their constants, each kernel named
    prefix_<type>."""
    return {int(GGMLQuantizationType[name]): specialize(template, f"{prefix}_{name.lower()}", values, **options)
            for name, values in constants.items()}


def parallel_and_serial(template, **options):
    """`template` (a loop over prange) as a parallel kernel for prompts and a serial one, named
    <template>_serial, for a few rows: waking numba's threads costs more than a few rows' work."""
    return (cached(parallel=True, **options)(template),
            specialize(template, template.__name__ + "_serial", {}, **options))
