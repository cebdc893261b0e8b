"""The daemons driven as openpilot's own harnesses drive modeld (its modeld test, its process replay): start the daemon,
wait until every input has a reader (PubMaster.wait_for_readers_to_update), then frames from frame 1, each camera's
state message before its frame. Every frame is answered from frame 1 on, on both transports and at every restart;
dropped road frames give what openpilot's modeld gives. The harness: tests/daemon_harness.py Harness."""
import random
import pytest
from cereal.services import MODELD_OUTPUTS
from msgq.visionipc import ROAD, WIDE_ROAD
from tests.daemon_harness import driver_harness, road_harness

FRAMES = 300    # modeld's frames, with random drops
RESTARTS = 3    # per daemon and transport here; bench/harness.py restarts each 20 times

@pytest.fixture(params=['zmq', 'shm'])
def transport(request, monkeypatch) -> str:
  monkeypatch.setenv('MSGQ_TRANSPORT', request.param)
  return request.param

class Drops:
  """openpilot modeld's frameDropPerc, as its modeld.py computes it: at every main frame, a first-order filter (10 s, at
  20 Hz) of min(frames dropped before it, 10), held at 0 for the first 10 frames; then 100 f / (1 + f)."""
  def __init__(self): self.last, self.runs, self.x = 0, 0, 0.

  def update(self, frame_id: int) -> tuple[int, float]:
    dropped = max(0, frame_id - self.last - 1)
    self.x += 0.05 / (10 + 0.05) * (min(dropped, 10) - self.x)
    if self.runs < 10: self.x = 0.
    self.runs, self.last = self.runs + 1, frame_id
    return dropped, 100 * self.x / (1 + self.x)

def plan(rng: random.Random, frames: int) -> dict[int, tuple]:
  """The cameras of each frame 1..frames: both, or a dropped road frame (the wide camera only, or none), alone or two
  back to back; none in the first 3 frames, and the last two are both cameras (the silence after a drop is checked by
  the answer after it)."""
  out, n = {}, 1
  while n <= frames:
    if 3 < n < frames - 2 and rng.random() < 0.1:
      for _ in range(2 if rng.random() < 0.3 else 1): out[n], n = rng.choice([(WIDE_ROAD,), ()]), n + 1
    else: out[n], n = (ROAD, WIDE_ROAD), n + 1
  return out

def test_modeld_answers_from_frame_1_with_random_dropped_road_frames(transport, tiny_artifacts):
  """openpilot's modeld test, frame 1 included: each frame's modelV2, drivingModelData and cameraOdometry carry its frame
  ids and end-of-frame time, frameAge 0 and openpilot's frameDropPerc; a road frame after a dropped one (the wide camera
  only, or no camera, alone or back to back) is prepare-only (counted, nothing published), and nothing is published
  for a frame without a road camera."""
  cams = plan(random.Random(39), FRAMES)
  kinds = [cams[n] for n in cams if ROAD not in cams[n]]
  assert (WIDE_ROAD,) in kinds and () in kinds and any(ROAD not in cams[n] and ROAD not in cams[n + 1] for n in cams if n < FRAMES)
  h, drops, prepare_only = road_harness(tiny_artifacts), Drops(), 0
  try:
    h.wait_for_readers()
    for n, streams in cams.items():
      eof = h.camera.send(n, streams)
      if ROAD not in streams: continue
      dropped, perc = drops.update(n)
      if dropped:
        prepare_only += 1
        h.notify.wait_count('prepare_only', prepare_only)
        assert [h.outputs[s].receive(non_blocking=True) for s in MODELD_OUTPUTS] == [None] * 3, f"frame {n} is prepare-only"
        continue
      mv2, dmd, odo = (h.answer(s) for s in ('modelV2', 'drivingModelData', 'cameraOdometry'))
      assert None not in (mv2, dmd, odo), f"frame {n} not answered; stderr:\n{h.daemon.stderr()}"
      m = mv2.modelV2
      assert (m.frameId, m.frameIdExtra, m.timestampEof, m.frameAge) == (n, n, eof, 0), n
      assert m.frameDropPerc == pytest.approx(perc, rel=1e-5, abs=1e-5), n
      assert (odo.cameraOdometry.frameId, odo.cameraOdometry.timestampEof, dmd.drivingModelData.frameId, dmd.drivingModelData.frameIdExtra) == (n, eof, n, n)
    assert h.notify.count('prepare_only') == prepare_only > 10
  finally: rc, _ = h.close()
  assert rc == 0

def test_dmonitoringd_answers_from_frame_1(transport, tiny_artifacts):
  """dmonitoringd driven the same way: every driver frame from frame 1 on, frame ids with gaps too, gives its
  driverStateV2 and a driverMonitoringState, and nothing more."""
  rng, h, n = random.Random(39), driver_harness(tiny_artifacts), 0
  try:
    h.wait_for_readers()
    for _ in range(100):
      n += rng.choice([1, 1, 1, 2, 3]) if n else 1
      h.camera.send(n)
      ds, dms = h.answer('driverStateV2'), h.answer('driverMonitoringState')
      assert ds is not None and dms is not None, f"frame {n} not answered; stderr:\n{h.daemon.stderr()}"
      assert ds.driverStateV2.frameId == n
  finally: rc, _ = h.close()
  assert rc == 0

@pytest.mark.parametrize('daemon', [road_harness, driver_harness])
def test_frame_1_is_answered_at_every_restart(transport, tiny_artifacts, daemon):
  """Each start anew, as openpilot's modeld test sets up each test: readers, then frame 1, answered every time."""
  for i in range(RESTARTS):
    h = daemon(tiny_artifacts)
    try: readers, answered = h.frame_one()
    finally: rc, _ = h.close()
    assert answered is not None and rc == 0, f"start {i + 1}: readers after {readers:.2f} s, frame 1 not answered; stderr:\n{h.daemon.stderr()}"
