"""openpilot routes end to end: a route written with openpilot's own schema replays through camerad and both real
daemons; what the project records reads back in openpilot's LogReader, message for message."""
import json, os, subprocess, sys, time
from pathlib import Path
import pytest
from cereal import messaging
from artifacts import CACHE, LAYOUT, REPO, build
from daemon_harness import Collector, Daemon
from openpilot_route import write_route

@pytest.fixture(scope="module")
def tiny_artifacts():
  return build(CACHE.parent / "tiny", models="tiny")

@pytest.fixture(scope="module")
def scene(tmp_path_factory) -> Path:
  p = tmp_path_factory.mktemp("scene") / "scene.json"
  p.write_text(json.dumps({"frames": 20, "calib": [0.01, 0.02, -0.015], "intrinsics": {
    c: {"width": LAYOUT.width, "height": LAYOUT.height, "focal_length": f} for c, f in (("road", 88.0), ("wide", 20.0), ("driver", 20.0))}}))
  return p

def run(module: str, *args, timeout: float = 120) -> subprocess.CompletedProcess:
  return subprocess.run([sys.executable, "-m", module, *map(str, args)], cwd=REPO, capture_output=True, text=True, timeout=timeout,
                        env={**os.environ, "DEV": "CPU"})

def test_openpilot_route_replays_through_both_daemons(tiny_artifacts, scene, tmp_path):
  """Two segments whose frame ids start at 100 (a drive's middle), road and driver cameras: in lockstep, exactly one
  modelV2 and one driverStateV2 per frame, with the log's frame ids; the log's calibration reaches the daemons."""
  ids = write_route(tmp_path / "route", scene)
  daemons = [Daemon(m, tiny_artifacts) for m in ("modeld", "dmonitoringd")]   # ready once camerad serves: lockstep waits for them
  col = Collector(["modelV2", "driverStateV2", "cameraOdometry"])
  try:
    cam = subprocess.Popen([sys.executable, "-m", "camerad", "--source", tmp_path / "route", "--lockstep", "--lockstep-timeout", "60"],
                           cwd=REPO, stderr=subprocess.PIPE, text=True)
    while cam.poll() is None:   # read as they come: a subscriber's queue is bounded
      col.poll()
      time.sleep(0.01)
    err = cam.communicate()[1]
    assert cam.returncode == 0 and f"served {len(ids)} frames" in err, err
    time.sleep(0.2)
    col.poll()
  finally:
    for d in daemons: d.stop()
    col.close()
  for svc in ("modelV2", "driverStateV2", "cameraOdometry"):
    assert [getattr(ev, svc).frameId for ev in col.msgs[svc]] == ids, svc
  assert all(ev.valid for ev in col.msgs["modelV2"]), "liveCalibration from the log was republished before the first frame"

def test_route_without_frames_is_refused(scene, tmp_path):
  """A route camerad can serve no camera frame from is an error that says why; --messages-only replays its messages."""
  write_route(tmp_path / "route", scene, segments=1, frames=3)
  (tmp_path / "route" / "route--0" / "fcamera.hevc").unlink()
  (tmp_path / "route" / "route--0" / "dcamera.hevc").unlink()
  r = run("camerad", "--source", tmp_path / "route", timeout=30)
  assert r.returncode == 1 and "no camera frame to serve" in r.stderr and "fcamera.hevc" in r.stderr and "--messages-only" in r.stderr, r.stderr
  r = run("camerad", "--source", tmp_path / "route", "--messages-only", timeout=30)
  assert r.returncode == 0 and "messages only" in r.stderr, r.stderr
  r = run("camerad", "--source", tmp_path / "nothing" / "here", timeout=30)
  assert r.returncode == 1 and "no such" in r.stderr, r.stderr
