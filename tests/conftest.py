import uuid
import pytest

@pytest.fixture(autouse=True)
def _openpilot_prefix(monkeypatch):
  """Every test gets its own OPENPILOT_PREFIX, so pub/sub endpoints and ringbuffers never collide across tests
  or parallel runs. Spawned child processes inherit it through the environment."""
  monkeypatch.setenv("OPENPILOT_PREFIX", f"t{uuid.uuid4().hex[:12]}")
