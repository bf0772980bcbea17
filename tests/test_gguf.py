import numpy as np
import pytest
from gguf import GGUFReader

from conftest import TINY_GEMMA3
from ggufmake import set_tensor_type, write_gguf
from llmsuite.core.errors import ModelFileError, UnsupportedError
from llmsuite.core.gguf import GGUFFile
from llmsuite.core.models import load_model


def test_metadata_and_tensors_match_gguf_reader():
    ours, ref = GGUFFile(TINY_GEMMA3), GGUFReader(str(TINY_GEMMA3))
    for key, field in ref.fields.items():
        if key.startswith("GGUF."):
            continue
        expected, got = field.contents(), ours.metadata[key]
        if isinstance(got, np.ndarray):
            np.testing.assert_array_equal(got, np.asarray(expected))
        else:
            assert got == expected, key
    assert len(ours.tensors) == len(ref.tensors)
    for t in ref.tensors:
        info = ours.tensors[t.name]
        assert info.shape == tuple(int(d) for d in t.shape)
        assert info.type == t.tensor_type
        assert info.offset == t.data_offset
        np.testing.assert_array_equal(ours.raw(t.name), np.asarray(t.data).view(np.uint8).reshape(-1))


def test_load_dequantizes_to_numpy_shape():
    f = GGUFFile(TINY_GEMMA3)
    w = f.load("blk.5.ffn_down.weight")  # Q4_0
    assert w.shape == f.tensors["blk.5.ffn_down.weight"].numpy_shape and w.dtype == np.float32


def test_not_a_gguf(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("hello, this is text and not a model\n")
    with pytest.raises(ModelFileError, match="not a GGUF file"):
        GGUFFile(path)


def test_empty_and_missing_files(tmp_path):
    (tmp_path / "empty.gguf").write_bytes(b"")
    with pytest.raises(ModelFileError, match="empty"):
        GGUFFile(tmp_path / "empty.gguf")
    with pytest.raises(ModelFileError, match="no such file"):
        GGUFFile(tmp_path / "missing.gguf")


@pytest.mark.parametrize("keep", [12, 200, 4_000_000])
def test_truncated_file(tmp_path, keep):
    path = tmp_path / "cut.gguf"
    path.write_bytes(TINY_GEMMA3.read_bytes()[:keep])
    with pytest.raises(ModelFileError, match="truncated"):
        GGUFFile(path)


def test_unknown_tensor_type(tmp_path):
    path = write_gguf(tmp_path / "odd.gguf", "llama")
    set_tensor_type(path, "dummy.weight", 77)
    with pytest.raises(UnsupportedError, match="unknown tensor type id 77"):
        GGUFFile(path)


def test_unknown_architecture(tmp_path):
    path = write_gguf(tmp_path / "rwkv7.gguf", "rwkv7")
    with pytest.raises(UnsupportedError, match="unknown architecture 'rwkv7'"):
        load_model(path)


def test_missing_tensor_is_named(tmp_path):
    path = write_gguf(tmp_path / "bare.gguf", "llama", extra_kv={})
    with pytest.raises(ModelFileError, match="missing"):
        load_model(path)
