"""The CUDA backend: CuPy arrays on one GPU, cuBLAS for matmuls, RawKernels from cuda/*.cu for the rest.

Weights live on the device as f16, expanded there from the raw GGUF bytes by the dequantization
kernels (1-D weights, the norms, stay f32). Activations are f32; a matmul rounds them to f16 and
accumulates in f32 (what llama.cpp's CUDA backend does with f16 weights). Attention reads f16
K/V: an f32 cache is converted per call, so f16 is this backend's default cache type. Host
masks are uploaded once per mask. Sampling runs here; only the chosen token id reaches the host.

The backend reaches the device through a runtime: CupyRuntime (a GPU), or cuda_emu.EmulatedRuntime
(`--backend cuda-emu`: the same sources built for the host, arrays in host memory).
"""

from __future__ import annotations

import math

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as T

from ..quants import dequantize
from .base import Backend, Yarn
from .cpu import SPARSE_MIN_KV, alibi_slopes
from .kernels import (DEQUANT_KERNELS, GATHER_SHAPES, KERNEL_FILES, PF_ROWS, PREFILL_DIMS, KernelCompileError,
                      cuda_include_dirs, kernel_file, kernel_source, prefill_smem_bytes)

DECODE_MAX_ROWS = 8  # more query rows than this go to the prefill kernel (dense masks)
MIN_KEYS_PER_SPLIT = 256
NULL = np.uint64(0)  # a null pointer argument
F32, F16 = np.float32, np.float16
# ggml numerics are the cpu backend's; T5's unfused attention and the fused mask ops have no kernel
# here (the memory computes the masks in CuPy array operations instead)
UNSUPPORTED_OPS = frozenset({"MUL_MAT_GGML", "ATTN_SOFT_MAX", "BLOCK_TOPK_MASK", "BLOCK_BOUNDS"})
CACHE_ROW_TYPES = ("f32", "f16")  # SET_ROWS stores these, FLASH_ATTN_EXT reads these (no block caches yet)


class CupyRuntime:
    """CuPy on a GPU: the arrays, cuBLAS, and cuda/*.cu compiled by NVRTC. The backend reaches the
    device only through a runtime; cuda_emu.EmulatedRuntime is the same surface on the host."""

    name = "cuda"

    def __init__(self):
        import cupy
        from cupy_backends.cuda.libs import cublas

        self.cp, self.cublas = cupy, cublas

    def load_modules(self, file_names, progress=None) -> dict:
        options = tuple(f"-I{d}" for d in cuda_include_dirs())
        return {name: self._compiled(name, options) for name in file_names}

    def _compiled(self, file_name: str, options: tuple[str, ...]):
        module = self.cp.RawModule(code=kernel_source(file_name), options=options)
        try:
            module.compile()
        except self.cp.cuda.compiler.CompileException as e:
            lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
            first = next((ln for ln in lines if "error" in ln), lines[0] if lines else "unknown error")
            raise KernelCompileError(f"backend unavailable: cuda: {file_name} does not compile: {first}") from e
        return module

    def describe(self) -> str:
        cp = self.cp
        props = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)
        name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
        return f"CuPy {cp.__version__} on {name} (CUDA runtime {cp.cuda.runtime.runtimeGetVersion()})"


class Kernels:
    """The kernels of cuda/*.cu by name. Every file is loaded when the backend starts (so a broken
    source is refused before any model loads); the runtime caches the binaries on disk."""

    def __init__(self, runtime, progress=None):
        self.modules = runtime.load_modules(KERNEL_FILES, progress)
        self._functions: dict = {}

    def __getitem__(self, name: str):
        if name not in self._functions:
            function = self.modules[kernel_file(name)].get_function(name)
            if name.startswith("fattn_prefill_"):
                function.max_dynamic_shared_size_bytes = prefill_smem_bytes(int(name.rsplit("_", 1)[1]))
            self._functions[name] = function
        return self._functions[name]


def _grid(n: int, block: int = 256) -> tuple[int]:
    return (max(1, -(-n // block)),)


def _row_threads(ncols: int) -> int:
    return min(1024, max(32, -(-ncols // 32) * 32))


def _alibi_args(n_head: int, max_bias: float) -> tuple:
    """(max_bias, m0, m1, n_head_log2) as the kernels take them (slopes are 1 when max_bias is 0)."""
    n_head_log2 = 2 ** int(math.floor(math.log2(n_head)))
    m0 = 2.0 ** (-max_bias / n_head_log2) if max_bias > 0 else 1.0
    m1 = 2.0 ** (-max_bias / 2.0 / n_head_log2) if max_bias > 0 else 1.0
    return np.float32(max_bias), np.float32(m0), np.float32(m1), np.int32(n_head_log2)


class CUDABackend(Backend):
    reads_value_views = True  # V may be a strided view of K (MLA): the kernels take a row stride

    def __init__(self, attn_path: str = "auto", runtime=None, progress=None):
        self.runtime = runtime or CupyRuntime()
        self.name = self.runtime.name
        self.cp = self.xp = self.runtime.cp
        self.attn_path = attn_path
        self.notes: list[str] = []
        self.device = self.cp.cuda.Device()
        self.n_sm = self.device.attributes["MultiProcessorCount"]
        self.kernels = Kernels(self.runtime, progress)
        self._masks: dict[int, tuple[object, object, list]] = {}  # id(host mask) → (host, device, [max row count])

    def describe(self) -> str:
        return self.runtime.describe()

    def asarray(self, x):
        return self.cp.asarray(x)

    def to_numpy(self, x) -> np.ndarray:
        return self.cp.asnumpy(x) if isinstance(x, self.cp.ndarray) else np.asarray(x)

    def synchronize(self) -> None:
        self.cp.cuda.get_current_stream().synchronize()

    def supports(self, op: str, types: tuple[str, ...] = ()) -> bool:
        if op in UNSUPPORTED_OPS:
            return False
        if op in ("SET_ROWS", "FLASH_ATTN_EXT"):  # the kernels read f32/f16 caches only
            return all(t in CACHE_ROW_TYPES for t in types)
        return True

    def _launch(self, name: str, grid: tuple, block: int, args: tuple, shared_mem: int = 0) -> None:
        self.kernels[name](grid, (block,), args, shared_mem=shared_mem)

    # ---- weights -------------------------------------------------------------------------

    def prepare(self, weight_types, state_space: bool = False, cache_types=("f16",)) -> None:
        """Nothing to do: the kernels were compiled when the backend started."""

    def load_weight(self, raw: np.ndarray, qtype, shape: tuple[int, ...], name: str = ""):
        """A GGUF tensor on the device: f16 for matrices (expanded by kernels), f32 for vectors."""
        n = int(np.prod(shape))
        if len(shape) == 1:
            return self.cp.asarray(dequantize(raw, qtype, n, name=name))
        return self._expand_f16(self.cp.asarray(raw.reshape(-1).view(np.uint8)), qtype, n).reshape(shape)

    def _expand_f16(self, data, qtype, n: int):
        """Raw bytes (a device uint8 array) of any weight type → n f16 values on the device."""
        if qtype == T.F16:
            return data.view(F16)[:n].copy()
        if qtype == T.F32:
            return data.view(F32)[:n].astype(F16)
        out = self.cp.empty(n, dtype=F16)
        if qtype == T.BF16:
            self._launch("convert_bf16", _grid(n), 256, (data.view(self.cp.uint16), out, np.int64(n)))
        elif qtype in DEQUANT_KERNELS:
            kernel, threads_per_block = DEQUANT_KERNELS[qtype]
            n_blocks = n // GGML_QUANT_SIZES[qtype][0]
            self._launch(kernel, _grid(n_blocks * threads_per_block), 256, (data, out, np.int64(n_blocks)))
        else:  # no kernel for this type yet: expand on the host
            out[:] = self.cp.asarray(dequantize(self.cp.asnumpy(data), qtype, n, dtype=np.float16))
        return out

    def concatenate(self, arrays, axis: int = 0):
        return self.cp.concatenate(arrays, axis=axis)

    def take_rows(self, x, rows):
        return x[self.cp.asarray(rows)]

    # ---- dense algebra -------------------------------------------------------------------

    def matmul(self, x, w, out=None):
        """x @ w.T for a weight stored (n_out, n_in): cuBLAS with f16 inputs and f32 accumulation."""
        if w.dtype != F16:
            return self.cp.matmul(x, w.T, out=out)
        lead, k, m = x.shape[:-1], x.shape[-1], w.shape[0]
        n = int(np.prod(lead))
        direct = out is not None and out.dtype == F32 and out.flags.c_contiguous and out.size == n * m
        y = out if direct else self.cp.empty((n, m), dtype=F32)
        if n:
            x16 = self.cp.ascontiguousarray(x.reshape(n, k), dtype=F16)
            w = self.cp.ascontiguousarray(w)
            one, zero = np.ones(1, np.float32), np.zeros(1, np.float32)
            handle = self.cp.cuda.device.get_cublas_handle()
            self.runtime.cublas.setStream(handle, self.cp.cuda.get_current_stream().ptr)
            self.runtime.cublas.setPointerMode(handle, self.runtime.cublas.CUBLAS_POINTER_MODE_HOST)  # alpha and beta are host floats
            # row-major y (n, m) is column-major yᵀ = W xᵀ: W is column-major (k, m), op T
            self.runtime.cublas.gemmEx(handle, self.runtime.cublas.CUBLAS_OP_T, self.runtime.cublas.CUBLAS_OP_N, m, n, k,
                          one.ctypes.data, w.data.ptr, self.cp.cuda.runtime.CUDA_R_16F, k,
                          x16.data.ptr, self.cp.cuda.runtime.CUDA_R_16F, k,
                          zero.ctypes.data, y.data.ptr, self.cp.cuda.runtime.CUDA_R_32F, m,
                          self.runtime.cublas.CUBLAS_COMPUTE_32F, self.runtime.cublas.CUBLAS_GEMM_DEFAULT)
        y = y.reshape(*lead, m)
        if out is not None and not direct:
            out[...] = y
            return out
        return y

    def mul_mat(self, raw_w, w_type, shape: tuple[int, int], x):
        w = self._expand_f16(self.cp.asarray(raw_w).reshape(-1).view(self.cp.uint8), w_type, shape[0] * shape[1])
        return self.matmul(x, w.reshape(shape))

    def get_rows(self, table, ids):
        ids = self.cp.asarray(ids, dtype=self.cp.int32)
        if table.dtype != F16 or table.ndim != 2:
            return table[ids]
        out = self.cp.empty((len(ids), table.shape[1]), dtype=F32)
        if len(ids):
            self._launch("get_rows_f16", (len(ids),), 256, (table, ids, out, np.int32(table.shape[1])))
        return out

    def get_rows_raw(self, raw, w_type, shape: tuple[int, int], ids):
        """Rows of a raw (possibly quantized) table: the rows' bytes are expanded on the device."""
        data = self.cp.asarray(raw).reshape(-1).view(self.cp.uint8).reshape(shape[0], -1)[self.cp.asarray(ids)]
        return self._expand_f16(data.reshape(-1), w_type, len(ids) * shape[1]).reshape(len(ids), shape[1]).astype(F32)

    def set_rows(self, dst, ids, src, qtype=None):
        """dst with rows ids replaced by src (f16 rows are converted by a kernel)."""
        if qtype is not None:
            raise NotImplementedError("quantized rows are not supported by the CUDA backend yet")
        out = dst.copy()
        ids = self.cp.asarray(ids, dtype=self.cp.int64)
        if out.dtype == F16 and len(ids):
            src = self.cp.ascontiguousarray(src, dtype=F32)
            self._launch("set_rows_f16", (len(ids),), 256, (src, ids, out, np.int32(out.shape[-1])))
        else:
            out[ids] = src
        return out

    def rms_norm(self, x, weight, eps: float):
        x = self.cp.ascontiguousarray(x, dtype=F32)
        y = self.cp.empty_like(x)
        if x.size:
            ncols = x.shape[-1]
            w = NULL if weight is None else self.cp.ascontiguousarray(weight, dtype=F32)
            w_rows = 1 if weight is None else weight.size // ncols  # a (groups, ncols) weight repeats per group
            self._launch("rms_norm_f32", (x.size // ncols,), _row_threads(ncols),
                         (x, w, y, np.int32(ncols), np.int32(w_rows), np.float32(eps)))
        return y

    def norm(self, x, eps: float):
        x = self.cp.ascontiguousarray(x, dtype=F32)
        y = self.cp.empty_like(x)
        if x.size:
            ncols = x.shape[-1]
            self._launch("norm_f32", (x.size // ncols,), _row_threads(ncols), (x, y, np.int32(ncols), np.float32(eps)))
        return y

    # ---- activations ---------------------------------------------------------------------

    def _unary(self, name: str, x):
        x = self.cp.ascontiguousarray(x, dtype=F32)
        y = self.cp.empty_like(x)
        if x.size:
            self._launch(name, _grid(x.size), 256, (x, y, np.int64(x.size)))
        return y

    def silu(self, x):
        return self._unary("silu_f32", x)

    def gelu(self, x):
        return self._unary("gelu_f32", x)

    def swiglu(self, gate, up):
        return self.silu(gate) * up

    def geglu(self, gate, up):
        return self.gelu(gate) * up

    def gated_ffn(self, h, act: str):
        """act(gate) * up over a fused gate|up activation (n_tokens, 2 * n_ff), in one kernel."""
        h = self.cp.ascontiguousarray(h, dtype=F32)
        n_ff = h.shape[-1] // 2
        y = self.cp.empty(h.shape[:-1] + (n_ff,), dtype=F32)
        if y.size:
            self._launch(f"{act}_fused_f32", _grid(y.size), 256, (h, y, np.int32(n_ff), np.int64(y.size)))
        return y

    # ---- rotary embeddings ---------------------------------------------------------------

    def rope_cache(self, pos, n_rot: int, freq_base: float, freq_scale: float = 1.0, scaling: Yarn | None = None):
        """The kernel computes the angles itself: the table is the positions and the frequencies."""
        return self.cp.asarray(pos, dtype=self.cp.int32), n_rot, float(freq_base), float(freq_scale), \
            scaling or Yarn(0.0, (0.0, 0.0), 1.0)

    def rope(self, x, table, neox: bool):
        pos, n_rot, freq_base, freq_scale, scaling = table
        x = self.cp.ascontiguousarray(x, dtype=F32)
        y = self.cp.empty_like(x)
        n_tokens, n_head, head_dim = x.shape
        if x.size:
            self._launch("rope_f32", (n_tokens * n_head,), _row_threads(n_rot // 2),
                         (x, y, pos, np.int32(n_head), np.int32(head_dim), np.int32(n_rot), np.float32(freq_base),
                          np.float32(freq_scale), np.int32(neox), np.float32(scaling.ext_factor),
                          *(np.float32(d) for d in scaling.corr_dims), np.float32(scaling.mscale)))
        return y

    # ---- softmax and attention -----------------------------------------------------------

    def attn_soft_max(self, q, k, v, mask, scale: float):
        raise NotImplementedError("ATTN_SOFT_MAX has no CUDA kernel (supports() says so)")

    def cache_rows_f32(self, x):
        return x.astype(F32, copy=False)

    def soft_max_ext(self, x, mask, scale: float, max_bias: float = 0.0, sinks=None):
        """softmax(x * scale + slope_h * mask) over the last axis of x (n_head, rows, cols), with sinks."""
        x = self.cp.ascontiguousarray(x, dtype=F32)
        y = self.cp.empty_like(x)
        n_head, rows, ncols = x.shape
        mask = NULL if mask is None else self.cp.ascontiguousarray(mask, dtype=F32)
        sinks = NULL if sinks is None else self.cp.ascontiguousarray(sinks, dtype=F32)
        if x.size:
            self._launch("soft_max_f32", (n_head * rows,), _row_threads(ncols),
                         (x, mask, sinks, y, np.int32(rows), np.int32(ncols), np.float32(scale),
                          *_alibi_args(n_head, max_bias)))
        return y

    def flash_attn_ext(self, q, k, v, mask=None, scale: float = 1.0, softcap: float = 0.0, sinks=None,
                       max_bias: float = 0.0, n_kv_max: int = 0, path: str | None = None):
        """The contract of CPUBackend.flash_attn_ext, on the device: per-row sparse lists through the
        gather kernel where the hint pays (or is forced), the split-KV kernel for a few query rows,
        the WMMA kernel for prompts; head sizes without a kernel use plain CuPy algebra."""
        n_q, n_head, d_k = q.shape
        n_kv, n_head_kv, d_v = v.shape
        if n_q == 0 or n_kv == 0:
            return self.cp.zeros((n_q, n_head, d_v), dtype=F32)
        q = self.cp.ascontiguousarray(q, dtype=F32)
        mask_dev, row_max = self._device_mask(mask)
        sinks = None if sinks is None else self.cp.ascontiguousarray(sinks, dtype=F32)
        path = path or self.attn_path
        want_sparse = n_kv_max > 0 and mask is not None and path != "dense" and \
            (path == "sparse" or n_kv >= max(SPARSE_MIN_KV, 2 * n_kv_max))
        if (d_k, d_v) not in GATHER_SHAPES:
            return self._attend_plain(q, k, v, mask_dev, scale, softcap, sinks, max_bias)
        k16, k_row = _kv_f16(self.cp, k)
        v16, v_row = _kv_f16(self.cp, v)
        params = (np.int32(n_q), np.int32(n_kv), np.int32(n_head), np.int32(n_head_kv), np.int64(k_row),
                  np.int64(v_row), np.float32(scale), np.float32(softcap), *_alibi_args(n_head, max_bias))
        self.last_attn_path = "dense"
        if want_sparse and row_max() <= n_kv_max:
            self.last_attn_path = "sparse"
            indices, cap = self._compact(mask_dev, n_q, n_kv, min(n_kv_max, n_kv))
            return self._attend_split(q, k16, v16, mask_dev, sinks, params, indices, cap)
        if n_q <= DECODE_MAX_ROWS or d_k != d_v or d_k not in PREFILL_DIMS:
            return self._attend_split(q, k16, v16, mask_dev, sinks, params, None, n_kv)
        return self._attend_prefill(q, k16, v16, mask_dev, sinks, params)

    def _device_mask(self, mask):
        """The mask on the device (uploaded once per host mask) and a lazy max of finite entries per row."""
        if mask is None:
            return NULL, lambda: 0
        key = id(mask)
        if key not in self._masks or self._masks[key][0] is not mask:
            if len(self._masks) > 8:
                self._masks.clear()
            self._masks[key] = (mask, self.cp.ascontiguousarray(self.cp.asarray(mask), dtype=F32), [])
        _, dev, count = self._masks[key]

        def row_max() -> int:
            if not count:
                xp = np if isinstance(mask, np.ndarray) else self.cp
                count.append(int(xp.isfinite(mask).sum(axis=1).max()))
            return count[0]
        return dev, row_max

    def _compact(self, mask, n_q: int, n_kv: int, cap: int):
        """Each mask row's finite columns, ascending, padded with -1 to `cap` (one list per row)."""
        indices = self.cp.empty((n_q, cap), dtype=self.cp.int32)
        counts = self.cp.empty(n_q, dtype=self.cp.int32)
        self._launch("mask_to_indices", (n_q,), 256,
                     (mask, np.int32(n_q), np.int32(n_kv), np.int32(1), np.int32(cap), indices, counts))
        return indices, cap

    def _attend_split(self, q, k16, v16, mask, sinks, params, indices, n_rows: int):
        """Split-KV, GQA-packed kernel over n_rows keys (or list slots), then the combine kernel."""
        n_q, n_head, d_k = q.shape
        n_head_kv, d_v = v16.shape[1], v16.shape[2]
        heads_per_block = GATHER_SHAPES[(d_k, d_v)]
        n_groups = -(-(n_head // n_head_kv) // heads_per_block)
        base_blocks = n_groups * n_head_kv * n_q
        n_split = max(1, min(-(-2 * self.n_sm // base_blocks), -(-n_rows // MIN_KEYS_PER_SPLIT)))
        part_acc = self.cp.empty((n_q, n_head, n_split, d_v), dtype=F32)
        part_ml = self.cp.empty((n_q, n_head, n_split, 2), dtype=F32)
        self._launch(f"fattn_decode_{d_k}_{d_v}_{heads_per_block}", (n_split * n_groups, n_head_kv, n_q), 128,
                     (q, k16, v16, mask, NULL if indices is None else indices, np.int32(n_rows if indices is not None else 0),
                      part_acc, part_ml, np.int32(n_split), *params))
        out = self.cp.empty((n_q, n_head, d_v), dtype=F32)
        self._launch("fattn_combine", (n_q * n_head,), d_v,
                     (part_acc, part_ml, NULL if sinks is None else sinks, out, np.int32(n_head), np.int32(n_split),
                      np.int32(d_v)))
        return out

    def _attend_prefill(self, q, k16, v16, mask, sinks, params):
        n_q, n_head, d = q.shape
        out = self.cp.empty((n_q, n_head, d), dtype=F32)
        self._launch(f"fattn_prefill_{d}", (-(-n_q // PF_ROWS), n_head), 128,
                     (q, k16, v16, mask, NULL if sinks is None else sinks, out, *params),
                     shared_mem=prefill_smem_bytes(d))
        return out

    def _attend_plain(self, q, k, v, mask, scale, softcap, sinks, max_bias):
        """Head sizes without a kernel: f32 CuPy algebra, one block of query rows at a time."""
        n_q, n_head, d_k = q.shape
        n_kv, n_head_kv, d_v = v.shape
        g = n_head // n_head_kv
        keys = self.cp.asarray(k, dtype=F32).transpose(1, 2, 0)[:, None]  # (h_kv, 1, d_k, n_kv)
        values = self.cp.asarray(v, dtype=F32).transpose(1, 0, 2)[:, None]  # (h_kv, 1, n_kv, d_v)
        slopes = self.cp.asarray(alibi_slopes(n_head, max_bias)).reshape(n_head_kv, g, 1, 1)
        sink = None if sinks is None else sinks.reshape(n_head_kv, g, 1, 1)
        out = self.cp.empty((n_q, n_head, d_v), dtype=F32)
        for t0 in range(0, n_q, 256):
            t1 = min(n_q, t0 + 256)
            s = self.cp.matmul(q[t0:t1].reshape(t1 - t0, n_head_kv, g, d_k).transpose(1, 2, 0, 3), keys) * np.float32(scale)
            if softcap:
                s = np.float32(softcap) * self.cp.tanh(s / np.float32(softcap))
            if mask is not NULL:
                s = s + slopes * mask[t0:t1]
            m = s.max(axis=-1, keepdims=True)
            if sink is not None:
                m = self.cp.maximum(m, sink)
            m = self.cp.where(self.cp.isfinite(m), m, 0.0)
            p = self.cp.exp(s - m)
            total = p.sum(axis=-1, keepdims=True) + (0.0 if sink is None else self.cp.exp(sink - m))
            ctx = self.cp.matmul(p / self.cp.where(total > 0, total, 1.0), values)  # (h_kv, g, rows, d_v)
            out[t0:t1] = ctx.transpose(2, 0, 1, 3).reshape(t1 - t0, n_head, d_v)
        return out

    # ---- state-space ops (Mamba) ---------------------------------------------------------

    def ssm_conv(self, x, state, w, seq_index):
        """The causal conv; contract in core/ops.py (SSM_CONV). Returns (out, new states)."""
        x = self.cp.ascontiguousarray(x, dtype=F32)
        state = self.cp.array(state, dtype=F32, order="C")
        w = self.cp.ascontiguousarray(w, dtype=F32)
        out = self.cp.empty_like(x)
        n_tokens, n_ch = x.shape
        if x.size:
            self._launch("ssm_conv_f32", _grid(n_ch, 128), 128,
                         (x, state, w, self.cp.asarray(seq_index, dtype=self.cp.int64), out, np.int32(n_tokens),
                          np.int32(n_ch), np.int32(w.shape[1])))
        return out, state

    def ssm_scan(self, state, x, dt, A, B, C, seq_index):
        """The selective scan; contract in core/ops.py (SSM_SCAN). Returns (y, new states)."""
        state = self.cp.array(state, dtype=F32, order="C")
        x, dt, A, B, C = (self.cp.ascontiguousarray(a, dtype=F32) for a in (x, dt, A, B, C))
        y = self.cp.empty_like(x)
        n_tokens, n_head, head_dim = x.shape
        if x.size:
            self._launch("ssm_scan_f32", _grid(n_head * head_dim, 128), 128,
                         (state, x, dt, A, B, C, self.cp.asarray(seq_index, dtype=self.cp.int64), y, np.int32(n_tokens),
                          np.int32(n_head), np.int32(head_dim), np.int32(state.shape[3]), np.int32(B.shape[1]),
                          np.int32(A.shape[1])))
        return y, state

    # ---- sampling and selection ----------------------------------------------------------

    def argmax(self, x) -> int:
        x = self.cp.ascontiguousarray(x, dtype=F32).reshape(-1)
        out = self.cp.empty(1, dtype=self.cp.int32)
        self._launch("argmax_f32", (1,), 1024, (x, np.int32(x.size), out))
        return int(out.get()[0])

    def sample_cdf(self, probs, ids, u: float) -> int:
        probs = self.cp.ascontiguousarray(probs, dtype=F32)
        ids = self.cp.ascontiguousarray(ids, dtype=self.cp.int32)
        out = self.cp.empty(1, dtype=self.cp.int32)
        self._launch("sample_cdf_f32", (1,), 1024, (probs, ids, np.int32(probs.size), np.float32(u), out))
        return int(out.get()[0])

    def top_k(self, x, k: int):
        return self.cp.argsort(-self.cp.asarray(x), axis=-1)[..., :k].astype(self.cp.int32)


def _kv_f16(cp, x):
    """K or V rows as f16 with unit element stride and packed heads; returns (array, row stride)."""
    if x.dtype != F16:
        x = cp.asarray(x, dtype=F16)
    n_head_kv, d = x.shape[1], x.shape[2]
    if x.strides[2] != 2 or (n_head_kv > 1 and x.strides[1] != 2 * d) or x.strides[0] % 2:
        x = cp.ascontiguousarray(x)
    return x, x.strides[0] // 2
