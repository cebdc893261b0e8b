import shutil, uuid
import pytest
from msgq import runtime_dir

@pytest.fixture(autouse=True)
def _openpilot_prefix(monkeypatch):
  """Every test gets its own OPENPILOT_PREFIX, so pub/sub endpoints and ringbuffers never collide across tests
  or parallel runs. Spawned child processes inherit it through the environment. Its runtime directory (sockets,
  publisher locks) is removed afterwards."""
  monkeypatch.setenv("OPENPILOT_PREFIX", f"t{uuid.uuid4().hex[:12]}")
  path = runtime_dir()
  yield
  shutil.rmtree(path, ignore_errors=True)
