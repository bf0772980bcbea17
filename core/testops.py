"""The work behind `llm test-ops` (test-backend-ops): every case of every op run on a backend and
checked against the op's float64 reference (test), timed (perf), or listed (support)."""

from __future__ import annotations

import re
import time
import zlib
from dataclasses import dataclass

import numpy as np

from .errors import InvalidInputError
from .ops import OPS, Case

MODES = ("test", "perf", "support")
PERF_SECONDS = 0.5


@dataclass
class CaseResult:
    backend: str
    case: str
    op: str
    mode: str
    supported: bool = True
    passed: bool = True
    error: str = ""
    time_us: float = 0.0
    n_runs: int = 0
    flops: float = 0.0  # per second
    bandwidth_gb_s: float = 0.0
    flop_per_run: float = 0.0
    bytes_per_run: float = 0.0


def select_cases(op_filter: str | None = None, params_regex: str | None = None, quick: bool = False,
                 perf: bool = False) -> list[Case]:
    """Cases whose op matches -o (op names, full case strings, or a regex) and whose name matches -p."""
    cases = [c for op in OPS.values() for c in op.all_cases(quick, perf)]
    if op_filter:
        wanted = _split_ops(op_filter)
        for entry in wanted:
            if re.fullmatch(r"[A-Z0-9_]+", entry) and entry not in OPS:
                raise InvalidInputError(f"unknown op '{entry}' (ops: {', '.join(OPS)})")
        cases = [c for c in cases if any(_op_matches(entry, c) for entry in wanted)]
    if params_regex:
        try:
            pattern = re.compile(params_regex)
        except re.error as e:
            raise InvalidInputError(f"-p '{params_regex}' is not a valid regular expression: {e}") from None
        cases = [c for c in cases if pattern.search(c.name)]
    return cases


def _split_ops(value: str) -> list[str]:
    """Comma-separated, except commas inside (...) which belong to a full case string."""
    parts, depth, current = [], 0, ""
    for ch in value:
        depth += (ch == "(") - (ch == ")")
        if ch == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += ch
    return [p.strip() for p in parts + [current] if p.strip()]


def _op_matches(entry: str, case: Case) -> bool:
    if "(" in entry:
        return entry == case.name
    if re.fullmatch(r"[A-Z0-9_]+", entry):
        return entry == case.op.name
    return re.search(entry, case.op.name) is not None


def _rng(case: Case) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(case.name.encode()))


def nmse(actual: np.ndarray, expected: np.ndarray) -> float:
    """Normalized mean squared error, test-backend-ops' measure: sum((a - b)^2) / sum(a^2)."""
    a = np.asarray(actual, dtype=np.float64).reshape(-1)
    b = np.asarray(expected, dtype=np.float64).reshape(-1)
    denom = float(np.sum(a * a))
    err = float(np.sum((a - b) ** 2))
    return err / denom if denom > 0 else err


def supports(backend, case: Case) -> bool:
    return backend.supports(case.op.name, case_types(case))


def case_types(case: Case) -> tuple[str, ...]:
    """The tensor types a case names (its `type`, `type_a`, `type_K`… parameters)."""
    return tuple(v for k, v in case.params.items() if (k == "type" or k.startswith("type_")) and isinstance(v, str))


def run_test(backend, case: Case) -> CaseResult:
    result = CaseResult(backend.name, case.name, case.op.name, "test")
    if not supports(backend, case):
        result.supported = False
        return result
    inputs = case.op.make(case.params, _rng(case))
    expected = case.op.reference(inputs, case.params)
    actual = backend.to_numpy(case.op.run(backend, _to_backend(backend, inputs), case.params))
    actual = np.asarray(actual, dtype=np.float64).reshape(expected.shape)
    if np.isnan(actual).any():
        result.passed, result.error = False, f"NaN at index {int(np.flatnonzero(np.isnan(actual.reshape(-1)))[0])}"
        return result
    inf_a, inf_e = np.isinf(actual), np.isinf(expected)
    if (inf_a != inf_e).any() or (np.sign(actual[inf_a]) != np.sign(expected[inf_e])).any():
        result.passed, result.error = False, "inf values differ"
        return result
    finite = ~inf_e
    err = nmse(actual[finite], expected[finite])
    limit = case.op.nmse(case.params)
    if not err <= limit:
        result.passed, result.error = False, f"ERR = {err:.9f} > {limit:.9f}"
    return result


def _to_backend(backend, inputs: dict) -> dict:
    return {k: (backend.asarray(v) if isinstance(v, np.ndarray) else v) for k, v in inputs.items()}


def run_perf(backend, case: Case, seconds: float = PERF_SECONDS) -> CaseResult:
    result = CaseResult(backend.name, case.name, case.op.name, "perf")
    if not supports(backend, case):
        result.supported = False
        return result
    inputs = _to_backend(backend, case.op.make(case.params, _rng(case)))
    sync = backend.synchronize
    out = case.op.run(backend, inputs, case.params)  # warm-up (and compile, on a GPU)
    sync()
    runs, start = 0, time.perf_counter()
    while True:
        case.op.run(backend, inputs, case.params)
        runs += 1
        sync()
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            break
    result.n_runs, result.time_us = runs, elapsed / runs * 1e6
    result.flop_per_run = case.op.flops(case.params)
    result.bytes_per_run = sum(getattr(v, "nbytes", 0) for v in inputs.values()) + getattr(out, "nbytes", 0)
    if result.flop_per_run:
        result.flops = result.flop_per_run * runs / elapsed
    else:
        result.bandwidth_gb_s = result.bytes_per_run * runs / elapsed / 2**30
    return result


def format_perf(r: CaseResult) -> str:
    """`  NAME: <pad> N runs - X us/run - Y GFLOP/run - Z GFLOPS` like test-backend-ops."""
    name = f"  {r.case}:"
    pad = max(5, -(-len(name) // 8) * 8 - len(name))
    head = f"{name}{' ' * pad}    {r.n_runs:8d} runs - {r.time_us:10.2f} us/run - "
    if r.flop_per_run:
        amount, unit = _scaled(r.flop_per_run, "FLOP")
        rate, rate_unit = _scaled(r.flops, "FLOP")
        return head + f"{amount:6.2f} {unit}/run - {rate:8.2f} {rate_unit}S"
    return head + f"{r.bytes_per_run / 1024:8.0f} kB/run - {r.bandwidth_gb_s:8.2f} GB/s"


def _scaled(value: float, unit: str) -> tuple[float, str]:
    for prefix, factor in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if value >= factor:
            return value / factor, prefix + unit
    return value, unit
