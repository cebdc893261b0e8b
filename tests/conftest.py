import glob, json, os, shutil, uuid
from pathlib import Path
import pytest
from msgq import IpcError, remove_stack
from msgq.zmq import runtime_dir
from tests.artifacts import CACHE, LAYOUT, build

@pytest.fixture(autouse=True)
def _openpilot_prefix(monkeypatch):
  """Every test gets its own OPENPILOT_PREFIX, so pub/sub endpoints and ringbuffers never collide across tests
  or parallel runs. Spawned child processes inherit it through the environment. What its stack leaves (queue files,
  sockets, locks) is removed afterwards."""
  monkeypatch.setenv("OPENPILOT_PREFIX", prefix := f"t{uuid.uuid4().hex[:12]}")
  yield
  os.environ["OPENPILOT_PREFIX"] = prefix   # a test may have moved to another (monkeypatch restores the outer one next)
  remove_stack()
  try: runtime = [os.path.dirname(runtime_dir())]
  except IpcError: runtime = []   # a test's own MSGQ_RUNTIME_DIR, gone with its tmp_path
  for other in [f"/dev/shm/msgq_*{prefix}*", f"/tmp/*{prefix}*_visionipc_*", *(f"{r}/*{prefix}*" for r in runtime)]:
    for path in glob.glob(other):   # stacks named after it (a test's nested prefixes), where ours
      try:
        if os.lstat(path).st_uid == os.geteuid(): shutil.rmtree(path) if os.path.isdir(path) else os.unlink(path)
      except OSError: pass   # gone meanwhile

@pytest.fixture(scope="session")
def tiny_artifacts() -> Path:
  """Both families from the tiny ONNX models of tests/onnx_models.py (the release's I/O): seconds to build."""
  return build(CACHE.parent / "tiny", models="tiny")

@pytest.fixture(scope="session")
def device_artifacts() -> Path:
  """tiny_artifacts built for CPU:1, a second tinygrad device: no host memory to the runtime, as a GPU's is not (the
  camera frames copied in, the outputs copied out, replays through tinygrad's own path), on any machine."""
  return build(CACHE.parent / "tiny-cpu1", models="tiny", device="CPU:1")

@pytest.fixture(scope="session")
def scene(tmp_path_factory) -> Path:
  """A synthetic scene whose cameras have the test buffers' size (tests/artifacts.py LAYOUT)."""
  p = tmp_path_factory.mktemp("scene") / "scene.json"
  p.write_text(json.dumps({"frames": 20, "calib": [0.01, 0.02, -0.015], "intrinsics": {
    c: {"width": LAYOUT.width, "height": LAYOUT.height, "focal_length": f} for c, f in (("road", 88.0), ("wide", 20.0), ("driver", 20.0))}}))
  return p
