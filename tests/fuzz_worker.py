"""Run GGUF mutants through `llm info`, `load_model` and `llm generate`, in a process of its own
with a cap on its address space and a time limit per mutant; print one JSON line per mutant.

    python tests/fuzz_worker.py MODEL.gguf fast|slow SEED WORKDIR

A finding is anything but a clean result: an exception that is not the engine's own error
class, a RuntimeWarning (turned into an error here), a mutant that runs out of time, or a
MemoryError from the cap. The test (test_fuzz_gguf.py) reads the lines and judges them.
"""

from __future__ import annotations

import contextlib
import io
import json
import random
import resource
import signal
import sys
import time
import traceback
import warnings
from pathlib import Path

from gguf_mutants import GGUFImage, raw_mutants, structured_mutants

from llmsuite.cli.main import run
from llmsuite.core.errors import ModelFileError, UnsupportedError
from llmsuite.core.models import load_model

ADDRESS_SPACE_MARGIN = 3 << 30  # bytes a mutant may add to the worker's address space
SECONDS_PER_MUTANT = 60
FAST_STRUCTURED, FAST_FLIPS, SLOW_FLIPS = 160, 40, 1000


class OutOfTime(Exception):
    pass


def mutants(path: Path, which: str, seed: int):
    data = path.read_bytes()
    img = GGUFImage.parse(data)
    rng = random.Random(seed)
    structured = list(structured_mutants(img))
    if which == "fast":
        by_value = [m for m in structured if m[0].startswith(("value ", "missing "))]
        rest = [m for m in structured if not m[0].startswith(("value ", "missing "))]
        structured = rng.sample(by_value, min(FAST_STRUCTURED, len(by_value))) + rest
    for label, mutant in structured:
        yield label, mutant.serialize()
    yield from raw_mutants(data, img, rng, FAST_FLIPS if which == "fast" else SLOW_FLIPS)


def captured(argv: list[str]) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = run(argv)
    return rc, err.getvalue()


def check(path: Path) -> dict:
    """What the three entry points make of one file."""
    result = {}
    result["info_rc"], result["info_err"] = captured(["info", str(path)])
    try:
        load_model(path)
        result["load"] = "ok"
    except (ModelFileError, UnsupportedError) as e:
        result["load"], result["error"] = "refused", str(e)
        return result
    result["generate_rc"], result["generate_err"] = captured(
        ["generate", "-m", str(path), "-p", "Hello", "-n", "2", "--temp", "0", "-ub", "16"])
    return result


def main() -> None:
    model, which, seed, workdir = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), Path(sys.argv[4])
    warnings.simplefilter("error")
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    cap = _address_space() + ADDRESS_SPACE_MARGIN
    resource.setrlimit(resource.RLIMIT_AS, (cap if hard == resource.RLIM_INFINITY else min(cap, hard), hard))
    signal.signal(signal.SIGALRM, _out_of_time)
    target = workdir / "mutant.gguf"
    for label, data in mutants(model, which, seed):
        target.write_bytes(data)
        t0 = time.perf_counter()
        signal.alarm(SECONDS_PER_MUTANT)
        try:
            result = check(target)
        except OutOfTime:
            result = {"finding": f"more than {SECONDS_PER_MUTANT} s"}
        except BaseException as e:  # noqa: BLE001 - every other exception is what we look for
            result = {"finding": f"{type(e).__name__}: {e}"[:300],
                      "where": traceback.format_exc(limit=-3)[-1500:]}
        finally:
            signal.alarm(0)
        result.update(label=label, path=str(target), seconds=round(time.perf_counter() - t0, 3),
                      maxrss_mb=_peak_rss_mb())
        print(json.dumps(result), flush=True)


def _peak_rss_mb() -> int:
    """This process's own peak resident memory. ru_maxrss would not do: Linux starts a child's at
    the parent's resident size when it forked (a pytest worker's 2 GB read as a mutant's); the
    kernel's VmHWM belongs to the process's own memory map, made new at exec."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) // 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024


def _out_of_time(signum, frame):
    raise OutOfTime()


def _address_space() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmSize:"):
            return int(line.split()[1]) * 1024
    return 0


if __name__ == "__main__":
    main()
