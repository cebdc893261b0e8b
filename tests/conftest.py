import json, shutil, uuid
from pathlib import Path
import pytest
from msgq import runtime_dir
from tests.artifacts import CACHE, LAYOUT, build

@pytest.fixture(autouse=True)
def _openpilot_prefix(monkeypatch):
  """Every test gets its own OPENPILOT_PREFIX, so pub/sub endpoints and ringbuffers never collide across tests
  or parallel runs. Spawned child processes inherit it through the environment. Its runtime directory (sockets,
  publisher locks) is removed afterwards."""
  monkeypatch.setenv("OPENPILOT_PREFIX", f"t{uuid.uuid4().hex[:12]}")
  path = runtime_dir()
  yield
  shutil.rmtree(path, ignore_errors=True)

@pytest.fixture(scope="session")
def tiny_artifacts() -> Path:
  """Both families from the tiny ONNX models of tests/onnx_models.py (the release's I/O): seconds to build."""
  return build(CACHE.parent / "tiny", models="tiny")

@pytest.fixture(scope="session")
def scene(tmp_path_factory) -> Path:
  """A synthetic scene whose cameras have the test buffers' size (tests/artifacts.py LAYOUT)."""
  p = tmp_path_factory.mktemp("scene") / "scene.json"
  p.write_text(json.dumps({"frames": 20, "calib": [0.01, 0.02, -0.015], "intrinsics": {
    c: {"width": LAYOUT.width, "height": LAYOUT.height, "focal_length": f} for c, f in (("road", 88.0), ("wide", 20.0), ("driver", 20.0))}}))
  return p
