"""openpilot routes end to end: a route written with openpilot's own schema replays through camerad and both real
daemons; what the project records reads back in openpilot's LogReader, message for message."""
import json, os, shutil, subprocess, sys
from tests.artifacts import ALT_LAYOUT, CACHE, REPO, UNSERVED_LAYOUT, build
from tests.daemon_harness import Collector, Daemon
from tests.openpilot_route import lockstep, write_route

def run(module: str, *args, timeout: float = 120) -> subprocess.CompletedProcess:
  return subprocess.run([sys.executable, "-m", module, *map(str, args)], cwd=REPO, capture_output=True, text=True, timeout=timeout,
                        env={**os.environ, "DEV": "CPU"})

def test_openpilot_route_replays_through_both_daemons(tiny_artifacts, scene, tmp_path):
  """Two segments whose frame ids start at 100 (a drive's middle), road and driver cameras: in lockstep, exactly one
  modelV2 and one driverStateV2 per frame, with the log's frame ids; the log's calibration reaches the daemons. Then
  --start and --frames pick frames by the log's ids in the route's segment 1, named as openpilot does (ROUTE/1; the
  daemons reconnect to the restarted camerad)."""
  ids = write_route(tmp_path / "route", scene)
  daemons = [Daemon(m, tiny_artifacts) for m in ("modeld", "dmonitoringd")]   # ready once camerad serves: lockstep waits for them
  col = Collector(["modelV2", "driverStateV2", "cameraOdometry"])
  try:
    lockstep(tmp_path / "route", col)
    for svc in ("modelV2", "driverStateV2", "cameraOdometry"):
      assert [getattr(ev, svc).frameId for ev in col.wait(svc, len(ids))] == ids, svc
    assert all(ev.valid for ev in col.msgs["modelV2"]), "liveCalibration from the log was republished before the first frame"
    for svc in col.msgs: col.msgs[svc].clear()
    lockstep(f"{tmp_path / 'route'}/1", col, "--start", "112", "--frames", "5")   # segment 1, as openpilot names it
    assert [ev.modelV2.frameId for ev in col.wait("modelV2", 5)] == list(range(112, 117))
    daemons.pop().stop()   # modeld alone: lockstep on modelV2 waits for no driver client
    for svc in col.msgs: col.msgs[svc].clear()
    lockstep(f"{tmp_path / 'route'}/0", col, "--lockstep-services", "modelV2", "--frames", "4")
    assert [ev.modelV2.frameId for ev in col.wait("modelV2", 4)] == list(range(100, 104))
  finally:
    for d in daemons: d.stop()
    col.close()

def test_route_without_frames_is_refused(scene, tmp_path):
  """A route camerad can serve no camera frame from is an error that says why; --messages-only replays its messages."""
  write_route(tmp_path / "route", scene, segments=1, frames=3)
  (tmp_path / "route" / "route--0" / "fcamera.hevc").unlink()
  (tmp_path / "route" / "route--0" / "dcamera.hevc").unlink()
  r = run("camerad", "--source", tmp_path / "route", timeout=30)
  assert r.returncode == 1 and "no camera frame to serve" in r.stderr and "fcamera.hevc" in r.stderr and "--messages-only" in r.stderr, r.stderr
  r = run("camerad", "--source", tmp_path / "route", "--messages-only", timeout=30)
  assert r.returncode == 0 and "messages only" in r.stderr, r.stderr
  write_route(tmp_path / "cut", scene, segments=1, frames=3)   # an rlog cut short before its first camera state: the cut is the cause
  (rlog := tmp_path / "cut" / "cut--0" / "rlog.zst").write_bytes(rlog.read_bytes()[:60])
  (tmp_path / "cut" / "cut--0" / "qlog.zst").unlink()
  r = run("camerad", "--source", tmp_path / "cut", timeout=30)
  assert r.returncode == 1 and "no camera states in the log; " in r.stderr and "rlog.zst: " in r.stderr and "--messages-only" in r.stderr, r.stderr
  r = run("modeld_tools.replay", tmp_path / "cut", "--artifacts", tmp_path / "unused")   # whose options have no --messages-only
  assert r.returncode == 2 and "no camera states in the log; " in r.stderr and "--messages-only" not in r.stderr, r.stderr
  r = run("camerad", "--source", tmp_path / "nothing" / "here", timeout=30)
  assert r.returncode == 1 and "no such" in r.stderr, r.stderr
  write_route(tmp_path / "other", scene, segments=1, frames=3)   # frame ids and segment numbers of two routes would collide
  r = run("camerad", "--source", tmp_path / "route" / "route--0", tmp_path / "other", "--messages-only", timeout=30)
  assert r.returncode == 1 and "segments of 2 routes" in r.stderr and "one route at a time" in r.stderr, r.stderr

def test_messages_keep_their_recorded_times(scene, tmp_path):
  """Messages between two frames go out one by one at their own recorded times (carState at 100 Hz stays 100 Hz, not
  bursts at the frame rate), after every stream's state of the frame before them."""
  from camerad.sources import LogSource
  from cereal.messaging import log_from_bytes
  from tests import openpilot_ref as op
  def car(fid: int, t: int) -> list:
    return [op.log.Event.new_message(logMonoTime=t + k * 10_000_000, valid=True, carState={"vEgo": fid + k / 10}) for k in range(1, 5)]
  write_route(tmp_path / "route", scene, segments=1, frames=4, extra=car)
  src = LogSource([str(tmp_path / "route")])
  ticks = list(src.ticks())
  cars = [(tk.t, ev.logMonoTime / 1e9) for tk in ticks if not tk.frames for _, dat in tk.msgs
          for ev in [log_from_bytes(dat)] if ev.which() == "carState"]
  assert len(cars) == 4 * 5 - 1 and all(len(tk.msgs) == 1 for tk in ticks if not tk.frames and tk.index == -1), \
    "each message its own tick (the first frame's carState goes out with that frame)"
  assert all(a == b for a, b in cars) and [a for a, _ in cars] == sorted(a for a, _ in cars)

def test_modeld_replay_compares_with_logged_outputs(tiny_artifacts, scene, tmp_path):
  """modeld-replay on a route without outputs (three cameras; given as its two segment folders) reports nothing to
  compare, which fails --tolerance; on the same route with those outputs logged (as a car's daemons would have) it finds them again exactly;
  with one logged value moved, a NaN in another and a logged frame the replay has no output for, it exits 1 naming
  the fields past the tolerance with their largest difference and its frame, and apart from them the missing frame."""
  from oproute import LogReader
  from tests import openpilot_ref as op
  cams = ("road", "wide", "driver")
  write_route(tmp_path / "plain", scene, cams)
  r = run("modeld_tools.replay", tmp_path / "plain" / "plain--0", tmp_path / "plain" / "plain--1", "--artifacts", tiny_artifacts, "--out", tmp_path / "first",
          "--tolerance", "0")   # which nothing can meet: nothing to compare fails it
  assert r.returncode == 1 and "replayed road, driver, wide of" in r.stdout and "the route logged no modelV2: 20 new ones" in r.stdout, r.stdout + r.stderr
  assert "modeld-replay: --tolerance 0: nothing to compare, the route logged none of the outputs replayed" in r.stderr.splitlines(), r.stderr
  logged = {}
  for dat, ev in LogReader(tmp_path / "first").raw():
    if ev.which() in ("modelV2", "driverStateV2"): logged[(ev.which(), getattr(ev, ev.which()).frameId)] = dat
  def outputs(moved: int | None):
    def extra(fid: int, t: int) -> list:
      evs = []
      for svc in ("modelV2", "driverStateV2"):
        with op.log.Event.from_bytes(logged[(svc, fid)]) as ev: b = ev.as_builder()
        b.logMonoTime = t
        if svc == "modelV2" and fid == moved: b.modelV2.position.y = [y + 0.5 for y in b.modelV2.position.y]
        if svc == "modelV2" and moved and fid == moved + 2: b.modelV2.laneLines[0].y[3] = float("nan")
        evs.append(b)
        if svc == "modelV2" and fid == moved:   # an output of frame 7, which the route has no camera frame of
          (orphan := b.copy()).modelV2.frameId = 7
          evs.append(orphan)
      return evs
    return extra
  write_route(tmp_path / "logged", scene, cams, extra=outputs(None))
  r = run("modeld_tools.replay", tmp_path / "logged", "--artifacts", tiny_artifacts, "--out", tmp_path / "second", "--tolerance", "0")
  assert r.returncode == 0, r.stdout + r.stderr
  rows = {l.split()[0]: l.split()[1:] for l in r.stdout.splitlines() if l.startswith(("modelV2.", "driverStateV2."))}
  assert rows["modelV2.position"][:5] == ["20", "0", "0", "0", "0"] and rows["driverStateV2.faceOrientation"][:5] == ["20", "0", "0", "0", "0"]
  write_route(tmp_path / "moved", scene, cams, extra=outputs(107))
  r = run("modeld_tools.replay", tmp_path / "moved", "--artifacts", tiny_artifacts, "--out", tmp_path / "third", "--tolerance", "0.1", "--frames", "12")
  verdict = [l for l in r.stderr.splitlines() if l.startswith("modeld-replay: ")]
  assert r.returncode == 1 and verdict == [
    "modeld-replay: past the tolerance 0.1: modelV2.position (max diff 0.5 at frame 107), modelV2.laneLines (max diff inf at frame 109)",
    "modeld-replay: 1 logged modelV2 frame without a replayed output (7): with --tolerance a missing frame fails the replay too"], r.stderr
  row = next(l for l in r.stdout.splitlines() if l.startswith("modelV2.position")).split()
  assert row[1:4] == ["12", "1", "0"] and float(row[4]) == 0.5 and row[6] == "107", row

def test_modeld_replay_of_a_route_without_driver_video(tiny_artifacts, scene, tmp_path):
  """openpilot logs the driver camera's states and driverEncodeIdx without dcamera.hevc unless RecordFront is on:
  modeld-replay replays the road camera alone (no dmonitoringd, no driverStateV2 in the new route) and compares
  modelV2 only, saying why driverStateV2 is not compared, so the logged driverStateV2 are not counted as missing."""
  from oproute import LogReader
  from tests import openpilot_ref as op
  def driver_state(fid: int, t: int) -> list:
    return [op.log.Event.new_message(logMonoTime=t, valid=True, driverStateV2={"frameId": fid})]
  write_route(tmp_path / "route", scene, ("road", "driver"), segments=1, frames=5, extra=driver_state)
  (tmp_path / "route" / "route--0" / "dcamera.hevc").unlink()
  r = run("modeld_tools.replay", tmp_path / "route", "--artifacts", tiny_artifacts, "--out", tmp_path / "new", "--tolerance", "0")
  # the route logged no modelV2 either: nothing to compare fails the tolerance, and that is all it says
  assert r.returncode == 1 and [l for l in r.stderr.splitlines() if not l.startswith("modeld-replay: camerad: ")] == [
    "modeld-replay: --tolerance 0: nothing to compare, the route logged none of the outputs replayed"], r.stdout + r.stderr
  assert "replayed road of" in r.stdout and "driverStateV2 not compared, no camera it answers was replayed (driver: no dcamera.hevc" in r.stdout, r.stdout
  new = [ev.which() for ev in LogReader(tmp_path / "new")]
  assert new.count("modelV2") == 5 and "driverStateV2" not in new and "driverCameraState" in new, sorted(set(new))

def test_modeld_replay_serves_the_artifacts_layout_and_leaves_nothing_when_it_fails(scene, tmp_path):
  """Artifacts built for the aligned layout alone (what `modeld-compile --camera WxH:aligned` builds): camerad serves
  that layout, every frame is answered. A replay whose daemon fails (an artifact altered after the build) removes the
  route it began, and the folders made for it; artifacts that are missing, or have no layout of the route's camera
  size, are refused before anything starts, naming what to build."""
  from modelrt.artifact import warp_name
  from oproute import LogReader
  aligned = build(CACHE.parent / "tiny-aligned", layouts=(ALT_LAYOUT,), models="tiny")
  write_route(tmp_path / "route", scene, ("road", "driver"), segments=1, frames=5)
  r = run("modeld_tools.replay", tmp_path / "route", "--artifacts", aligned, "--out", tmp_path / "new")
  assert r.returncode == 0, r.stdout + r.stderr
  new = [ev.which() for ev in LogReader(tmp_path / "new")]
  assert new.count("modelV2") == 5 and new.count("driverStateV2") == 5, sorted(set(new))

  shutil.copytree(aligned, altered := tmp_path / "altered")
  with open(altered / "road" / "vision.bin", "ab") as f: f.write(b"\0")
  r = run("modeld_tools.replay", tmp_path / "route", "--artifacts", altered, "--out", tmp_path / "made" / "broken")
  assert r.returncode == 1 and "modeld exited with 78" in r.stderr and "no route written" in r.stderr, r.stdout + r.stderr
  assert not (tmp_path / "made").exists(), "the partial route and the folder made for it are removed"
  r = run("modeld_tools.replay", tmp_path / "route", "--artifacts", aligned, "--out", tmp_path / "new")
  assert r.returncode == 2 and f"--out {tmp_path / 'new'}: already exists" in r.stderr, r.stderr   # never written into, nor removed

  r = run("modeld_tools.replay", tmp_path / "route", "--artifacts", tmp_path / "nothing", "--out", tmp_path / "none")
  assert r.returncode == 1 and str(tmp_path / "nothing") in r.stderr and not (tmp_path / "none").exists(), r.stderr
  for family in ("road", "dm"):   # manifests of another camera size alone (the layout check reads nothing else)
    manifest = json.loads((aligned / family / "manifest.json").read_text())
    warp = manifest["jits"][warp_name(str(UNSERVED_LAYOUT))] = manifest["jits"].pop(warp_name(manifest["layouts"][0]))
    next(i for i in warp["inputs"] if i["name"] == "frame")["layout"] = str(UNSERVED_LAYOUT)
    manifest["layouts"] = [str(UNSERVED_LAYOUT)]
    (tmp_path / "other" / family).mkdir(parents=True)
    (tmp_path / "other" / family / "manifest.json").write_text(json.dumps(manifest))
  r = run("modeld_tools.replay", tmp_path / "route", "--artifacts", tmp_path / "other", "--out", tmp_path / "none")
  assert r.returncode == 1 and f"the road camera is 64x48, {tmp_path / 'other' / 'road'} was built for {UNSERVED_LAYOUT}" in r.stderr, r.stderr
  assert "--camera 64x48" in r.stderr and not (tmp_path / "none").exists(), r.stderr

def test_modeld_replay_stops_its_stack_on_sigterm_and_passes_camerad_warnings_on(tiny_artifacts, scene, tmp_path):
  """SIGTERM (a service manager, `timeout`, a cancelled CI job) stops modeld-replay as Ctrl-C does: its daemons,
  recorder and camerad stop with it, the partial route is removed, exit 128 + 15. A route whose segment 1 video is
  damaged replays segment 0, and what camerad could not serve is said on stderr, not only in camerad's log."""
  import signal, time
  write_route(tmp_path / "route", scene, ("road", "driver"), segments=2, frames=5)
  (tmp_path / "route" / "route--1" / "fcamera.hevc").write_bytes(os.urandom(4000))
  r = run("modeld_tools.replay", tmp_path / "route", "--artifacts", tiny_artifacts, "--out", tmp_path / "new")
  assert r.returncode == 0 and "modeld-replay: camerad: skipped" in r.stderr and "fcamera.hevc" in r.stderr, r.stdout + r.stderr
  (rlog := tmp_path / "route" / "route--1" / "rlog.zst").write_bytes(rlog.read_bytes()[:-200])   # a log cut short: said once
  r = run("modeld_tools.replay", tmp_path / "route", "--artifacts", tiny_artifacts, "--out", tmp_path / "newer")
  said = [l for l in r.stderr.splitlines() if "rlog.zst" in l]
  assert r.returncode == 0 and len(said) == 1 and said[0].startswith("modeld-replay: camerad: ") and "rlog.zst: " in said[0], r.stderr
  write_route(tmp_path / "long", scene, ("road", "driver"), segments=1, frames=400)
  p = subprocess.Popen([sys.executable, "-m", "modeld_tools.replay", str(tmp_path / "long"), "--artifacts", str(tiny_artifacts), "--out",
                        str(tmp_path / "cut")], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "DEV": "CPU"})
  deadline, kids = time.monotonic() + 60, []
  while time.monotonic() < deadline and len(kids) < 4:   # modeld, dmonitoringd, the recorder and camerad
    kids = subprocess.run(["pgrep", "-P", str(p.pid)], capture_output=True, text=True).stdout.split()
    time.sleep(0.2)
  assert len(kids) == 4, f"the stack did not start: {kids}"
  time.sleep(2)
  p.send_signal(signal.SIGTERM)
  _, err = p.communicate(timeout=60)
  assert p.returncode == 128 + signal.SIGTERM and "no route written" in err and not (tmp_path / "cut").exists(), err
  assert not [k for k in kids if os.path.exists(f"/proc/{k}") and open(f"/proc/{k}/stat").read().split()[2] != "Z"], "a process of the stack outlived it"

def test_a_camera_restart_mid_route_serves_each_frame_its_own_picture(scene, tmp_path):
  """A route whose camera restarted in its segment 1 (frame ids 100.. again): each logged frame is served the picture
  recorded for it, not that of the later frame with the same id; a frame the encoder dropped before the restart is
  skipped, not served a picture of the later run. A second pass (camerad --loop) serves the same again."""
  import numpy as np
  from camerad.render import SceneRenderer
  from camerad.scene import load_scene
  from camerad.sources import LogSource
  from msgq.visionipc.layout import NV12Layout
  ids = write_route(tmp_path / "route", scene, ("road",), segments=2, frames=4, restart=4, missing={("road", -1 - 2)})
  assert ids == [100, 101, 102, 103, 100, 101, 102, 103]
  sc = load_scene(str(scene))
  layout = NV12Layout.packed(sc.cameras["road"].width, sc.cameras["road"].height)
  render, src = SceneRenderer(sc, "road", layout), LogSource([str(tmp_path / "route")])
  for loop_pass in (1, 2):   # camerad --loop: each pass serves the route from its start again
    served = {}
    for tick in src.ticks():
      for fill in tick.frames.values():
        fill(out := np.zeros(layout.size, np.uint8), layout)
        served[tick.t] = out
    assert len(served) == 7 and sum(src.skipped.values()) == loop_pass, src.skipped
    for n, out in enumerate(out for _, out in sorted(served.items())):
      n += n >= 2   # the route's frame 2 was dropped
      assert np.array_equal(out, render.render(n % sc.n_frames)), f"pass {loop_pass}: frame {n} got another picture"
