"""Build small GGUF files for tests with gguf's own writer, and corrupt them on purpose."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import GGUFWriter


def write_gguf(path: Path, arch: str, tensors: dict[str, np.ndarray] | None = None, extra_kv=None) -> Path:
    writer = GGUFWriter(str(path), arch)
    writer.add_block_count(1)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt-2")
    writer.add_token_list(["a", "b", "ab"])
    writer.add_token_merges(["a b"])
    for key, value in (extra_kv or {}).items():
        writer.add_string(key, value)
    for name, array in (tensors or {"dummy.weight": np.ones((2, 32), np.float32)}).items():
        writer.add_tensor(name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def set_tensor_type(path: Path, tensor_name: str, type_id: int) -> None:
    """Overwrite the type field of one tensor's directory entry."""
    data = bytearray(path.read_bytes())
    name = tensor_name.encode()
    at = data.find(len(name).to_bytes(8, "little") + name)
    assert at >= 0, tensor_name
    pos = at + 8 + len(name)
    n_dims = int.from_bytes(data[pos:pos + 4], "little")
    type_at = pos + 4 + 8 * n_dims
    data[type_at:type_at + 4] = type_id.to_bytes(4, "little")
    path.write_bytes(bytes(data))
