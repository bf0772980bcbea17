"""`llm test-ops`: check every op on a backend against its reference (test-backend-ops)."""

from __future__ import annotations

import csv
import json
import sys
import time
from typing import Annotated, Optional

import typer

from llmsuite.core.backend import available_backends, get_backend
from llmsuite.core.errors import InvalidInputError
from llmsuite.core.testops import MODES, CaseResult, format_perf, run_perf, run_test, select_cases, supports


GREEN, RED, RESET = "\033[1;32m", "\033[1;31m", "\033[0m"
CSV_FIELDS = ["test_time", "backend_name", "op_name", "op_params", "test_mode", "supported", "passed",
              "error_message", "time_us", "flops", "bandwidth_gb_s", "n_runs", "device_description"]


def test_ops(
    mode: Annotated[str, typer.Argument(help="test, perf or support")] = "test",
    op: Annotated[Optional[str], typer.Option("-o", help="ops: names, full case strings or a regex; comma list")] = None,
    backend: Annotated[Optional[str], typer.Option("-b", help="backend to check (default: every available one)")] = None,
    params: Annotated[Optional[str], typer.Option("-p", help="regex on the case string")] = None,
    output: Annotated[str, typer.Option("--output", help="console, csv or json")] = "console",
    quick: Annotated[bool, typer.Option("--quick", help="the smaller case set (what pytest runs)")] = False,
) -> None:
    """Test, time or list the ops of each backend (test-backend-ops)."""
    if mode not in MODES:
        raise InvalidInputError(f"unknown mode '{mode}' (choose from {', '.join(MODES)})")
    if output not in ("console", "csv", "json"):
        raise InvalidInputError(f"unknown output '{output}' (console, csv or json)")
    # every backend in its float numerics: the ops' references are float products (MUL_MAT_GGML checks ggml's)
    names = [backend] if backend else available_backends()
    backends = [get_backend(name, numerics="f32") for name in names]
    cases = select_cases(op, params, quick=quick, perf=mode == "perf")
    console = output == "console"
    color = sys.stdout.isatty()
    ok_text = lambda ok: (f"{GREEN}OK{RESET}" if ok else f"{RED}FAIL{RESET}") if color else ("OK" if ok else "FAIL")  # noqa: E731
    if console:
        print(f"Testing {len(backends)} backend(s)\n")
    if not cases and console:
        print(f"  no test case matches{' -o ' + op if op else ''}{' -p ' + repr(params) if params else ''}")
    results: list[CaseResult] = []
    passed_backends = 0
    for n, b in enumerate(backends, 1):
        if console:
            print(f"Backend {n}/{len(backends)}: {b.name}\n  Device description: {b.describe()}\n")
        mine = [_run(mode, b, case, console, ok_text) for case in cases]
        results += mine
        tested = [r for r in mine if r.supported]
        failed = [r for r in tested if not r.passed]
        if console and mode == "test":
            print(f"  {len(tested) - len(failed)}/{len(tested)} tests passed")
            if failed:
                print("\n  Failing tests:\n" + "\n".join(f"    {r.case}" for r in failed))
            print(f"  Backend {b.name}: {ok_text(not failed)}")
        passed_backends += not failed
    if console and mode == "test":
        print(f"{passed_backends}/{len(backends)} backends passed\n{ok_text(passed_backends == len(backends))}")
    elif output == "json":
        print(json.dumps([_record(r, b) for r, b in _with_backend(results, backends)], indent=2))
    elif output == "csv":
        writer = csv.DictWriter(sys.stdout, fieldnames=CSV_FIELDS, quoting=csv.QUOTE_ALL)
        writer.writeheader()
        for r, b in _with_backend(results, backends):
            writer.writerow(_record(r, b))
    if any(r.supported and not r.passed for r in results):
        raise typer.Exit(1)


def _run(mode: str, backend, case, console: bool, ok_text) -> CaseResult:
    if mode == "support":
        result = CaseResult(backend.name, case.name, case.op.name, mode, supported=supports(backend, case))
        if console:
            print(f"  {case.name}: {'SUPPORTED' if result.supported else 'NOT SUPPORTED'}")
        return result
    result = run_test(backend, case) if mode == "test" else run_perf(backend, case)
    if console:
        if not result.supported:
            print(f"  {case.name}: not supported [{backend.name}]")
        elif mode == "perf":
            print(format_perf(result))
        else:
            prefix = f"  [{case.op.name}] {result.error}   " if not result.passed else "  "
            print(f"{prefix}{case.name}: {ok_text(result.passed)}", flush=True)
    return result


def _with_backend(results, backends):
    by_name = {b.name: b for b in backends}
    return [(r, by_name[r.backend]) for r in results]


def _record(r: CaseResult, backend) -> dict:
    return dict(test_time=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), backend_name=r.backend, op_name=r.op,
                op_params=r.case, test_mode=r.mode, supported=r.supported, passed=r.passed, error_message=r.error,
                time_us=round(r.time_us, 3), flops=r.flops, bandwidth_gb_s=r.bandwidth_gb_s, n_runs=r.n_runs,
                device_description=backend.describe())
