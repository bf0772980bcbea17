"""What every mat-vec (and the 8-bit GEMM) shares: a weight as parts stacked along the output, cut
into tasks of a few rows for numba's threads, and the parallel driver over a row dot."""

from __future__ import annotations

from numba import njit, prange, types
from numba.extending import overload

ROWS_PER_TASK = 32  # weight rows a worker takes at a time


def as_parts(w):
    """A weight as a tuple of parts: one (n_out, row_bytes) array, or a tuple of them."""


@overload(as_parts)
def _as_parts(w):
    if isinstance(w, types.Array):
        return lambda w: (w,)
    if isinstance(w, types.UniTuple):
        return lambda w: w
    return None


@njit(inline="always")
def count_tasks(parts, rows_per_task):
    n = 0
    for p in range(len(parts)):
        n += (parts[p].shape[0] + rows_per_task - 1) // rows_per_task
    return n


@njit(inline="always")
def task_rows(parts, task, rows_per_task):
    """The part task `task` works on, the output column of the part's first row, and the task's
    rows r0 .. r1 of it. A task finds its part by walking the parts: no task tables to allocate (a
    decoded token makes 120 such calls on SmolLM2, and two small allocations were a third of a
    small call's overhead)."""
    p, col, t = 0, 0, task + 0  # numba forbids writing a parallel loop's index, even inlined
    while t >= (parts[p].shape[0] + rows_per_task - 1) // rows_per_task:
        t -= (parts[p].shape[0] + rows_per_task - 1) // rows_per_task
        col += parts[p].shape[0]
        p += 1
    r0 = t * rows_per_task
    return parts[p], col, r0, min(r0 + rows_per_task, parts[p].shape[0])


def dot_row(dot, row, acts, i):
    """dot(row, acts[0][i], acts[1][i], ...): a row dot against activation row i, whatever the
    arrays the dot takes of it (numba takes no function of one arity in place of another)."""


@overload(dot_row, inline="always")
def _dot_row(dot, row, acts, i):
    if len(acts) == 2:
        return lambda dot, row, acts, i: dot(row, acts[0][i], acts[1][i])
    if len(acts) == 3:
        return lambda dot, row, acts, i: dot(row, acts[0][i], acts[1][i], acts[2][i])
    return None


@njit(inline="always")
def matvec_rows(w, acts, out, dot):
    """out[i, col + r] = dot(W[r], activation row i) for every row r of every part of w, parts
    stacked along out's columns (one parallel loop for q|k|v); `acts` holds the arrays whose row i
    the dot takes (the activations, or their q8 codes, and what it needs of them)."""
    parts = as_parts(w)
    for task in prange(count_tasks(parts, ROWS_PER_TASK)):
        part, col, r0, r1 = task_rows(parts, task, ROWS_PER_TASK)
        for r in range(r0, r1):
            for i in range(out.shape[0]):
                out[i, col + r] = dot_row(dot, part[r], acts, i)
