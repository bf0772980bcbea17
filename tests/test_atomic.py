"""Files the tools write replace the previous one whole, or leave it byte for byte (issue 32, item 2)."""

import resource

import numpy as np
import pytest

from conftest import tiny_gemma3
from llmsuite.core.atomic import atomic_writer, write_atomic
from llmsuite.core.batch import Batch
from llmsuite.core.context import Context, ContextParams
from llmsuite.core.errors import LLMError


def leftovers(directory):
    return sorted(p.name for p in directory.iterdir() if p.name.endswith(".partial"))


def test_a_writer_that_fails_midway_leaves_the_previous_file(tmp_path):
    target = tmp_path / "state.bin"
    target.write_bytes(b"previous")
    with pytest.raises(RuntimeError, match="midway"):
        with atomic_writer(target) as f:
            f.write(b"half of the new")
            raise RuntimeError("midway")
    assert target.read_bytes() == b"previous" and not leftovers(tmp_path)
    write_atomic(target, b"new")
    assert target.read_bytes() == b"new" and not leftovers(tmp_path)


def test_a_full_disk_during_a_state_save_is_one_sentence_and_keeps_the_previous_file(tmp_path):
    """RLIMIT_FSIZE stands in for a full disk: the write past it fails with EFBIG (Python ignores SIGXFSZ)."""
    ctx = Context(tiny_gemma3(), ContextParams(n_ctx=64))
    assert ctx.decode(Batch.from_tokens(np.arange(4, 12))) == 0
    target = tmp_path / "prompt.cache"
    ctx.save_state(target, list(range(4, 12)))
    before = target.read_bytes()
    assert ctx.decode(Batch.from_tokens(np.arange(12, 40), pos0=8)) == 0  # the new state is larger
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (len(before), hard))
    try:
        with pytest.raises(LLMError) as failed:
            ctx.save_state(target, list(range(4, 40)))
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    message = str(failed.value)
    assert message.startswith(f"could not write {target} (") and message.endswith("the previous file is unchanged")
    assert "\n" not in message
    assert target.read_bytes() == before and not leftovers(tmp_path)
    assert ctx.load_state(target) == list(range(4, 12))


def test_a_new_file_gets_the_usual_permissions(tmp_path):
    import os
    import stat

    umask = os.umask(0o022)
    try:
        write_atomic(tmp_path / "f", b"x")
    finally:
        os.umask(umask)
    assert stat.S_IMODE((tmp_path / "f").stat().st_mode) == 0o644
