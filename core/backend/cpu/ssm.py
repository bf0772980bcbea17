"""State-space kernels (Mamba's causal conv and selective scan), compiled with numba.

Tokens come in ubatch order with `seq_index[t]`, the state row of token t's sequence: a
sequence's tokens are in position order, and sequences may be interleaved or of unequal length
(the no-kv oracle's histories), so one kernel serves every ubatch. Each kernel runs in parallel
over channels (conv) or heads (scan), which are independent, and walks the tokens in order
inside; the states are updated in place.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from .cache import cached, parallel_and_serial
from .scalar import FAST, fast_exp


def ssm_conv_rows(x, state, w, seq_index, out):
    """out[t, c] = sum_k window[k] · w[c, k] over window = (state[s, :, c], x[t, c]), then the
    window slides: state[s] keeps the last d_conv - 1 inputs. x (T, C), state (S, K - 1, C),
    w (C, K), out (T, C)."""
    n_tokens, n_ch = x.shape
    k_last = w.shape[1] - 1
    for c in prange(n_ch):
        for t in range(n_tokens):
            s = seq_index[t]
            acc = np.float32(0)
            for k in range(k_last):
                acc += state[s, k, c] * w[c, k]
            acc += x[t, c] * w[c, k_last]
            out[t, c] = acc
            for k in range(k_last - 1):
                state[s, k, c] = state[s, k + 1, c]
            if k_last > 0:
                state[s, k_last - 1, c] = x[t, c]


# one decoded token's conv is a few microseconds of work: less than waking numba's threads
ssm_conv_rows, ssm_conv_rows_serial = parallel_and_serial(ssm_conv_rows, fastmath=FAST)


@njit(inline="always")
def softplus(x):
    """ggml's: log(1 + e^x), and x itself above 20."""
    return x if x > np.float32(20) else np.log(np.float32(1) + np.exp(x))


@cached(fastmath=FAST, parallel=True)
def ssm_scan_rows(state, x, dt, A, B, C, seq_index, y):
    """The selective scan: per token, state = state · e^(Δ·A) + Δ · x ⊗ B and y = state · C, with
    Δ = softplus(dt). state (S, H, P, N), x (T, H, P), dt (T, H), A (H, N) for Mamba-1 or (H, 1)
    for Mamba-2 (one decay per head), B and C (T, G, N) with head h reading group h // (H / G),
    y (T, H, P)."""
    n_tokens, n_head, head_dim = x.shape
    n_state = state.shape[3]
    heads_per_group = n_head // B.shape[1]
    scalar_a = A.shape[1] == 1
    for h in prange(n_head):
        g = h // heads_per_group
        for t in range(n_tokens):
            s = seq_index[t]
            delta = softplus(dt[t, h])
            decay = fast_exp(delta * A[h, 0])
            for p in range(head_dim):
                x_dt = x[t, h, p] * delta
                acc = np.float32(0)
                for n in range(n_state):
                    if not scalar_a:
                        decay = fast_exp(delta * A[h, n])
                    value = state[s, h, p, n] * decay + B[t, g, n] * x_dt
                    state[s, h, p, n] = value
                    acc += value * C[t, g, n]
                y[t, h, p] = acc
