"""The llmsuite engine: GGUF models, tokenizers, memory, contexts and sampling on NumPy."""

import os

# Thread pools that spin after their work starve the other pool on a small machine: OpenBLAS's
# workers spin for 2^28 cycles by default after each matmul, numba's OpenMP workers for 300k
# iterations after each kernel, while a prompt alternates BLAS tiles and numba kernels. Short
# spins measured pp512 +40-60 % on SmolLM2 and Gemma 3 with tg unchanged (docs/performance.md).
# Read when the libraries load, so this must run before numpy is imported; a user's own
# setting wins.
os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")
os.environ.setdefault("GOMP_SPINCOUNT", "10000")
