"""modeld-batch on a real local Ray: the same outputs as the live daemons in lockstep (missing frames and the wide
road camera included), the artifacts' buffer layouts, retries of a killed worker, a corrupt segment reported while
the rest finish, Ctrl-C and --resume, diff, and the errors a user meets first; and on a real two-node cluster, a node
lost in the middle of a segment or while the workers start."""
import json, os, secrets, shutil, signal, socket, subprocess, sys, tempfile, time, uuid
from collections import Counter
from pathlib import Path
import pytest
from tests.artifacts import ALT_LAYOUT, CACHE, REPO, UNSERVED_LAYOUT, build
from tests.daemon_harness import Collector, Daemon, Notify
from tests.openpilot_route import event, lockstep, write_route
from modeld_tools.compare import compare, route_outputs
from oproute import LogReader, log_files

ENV = {**os.environ, "DEV": "CPU", "RAY_AUTH_MODE": "disabled"}
FRAMES = 8   # per segment of the test routes

def batch(*args, timeout: float = 300, env: dict = ENV) -> subprocess.CompletedProcess:
  return subprocess.run([sys.executable, "-m", "modeld_batch", *map(str, args), "--quiet"], cwd=REPO, capture_output=True, text=True, env=env,
                        timeout=timeout)

def start_batch(*args, env: dict = ENV) -> subprocess.Popen:
  """The job in a session of its own, as a terminal runs a command: a Ctrl-C there goes to its whole process group. A
  marker in its environment (Ray's workers inherit it) tells its processes from any other job's."""
  marker = f"MODELD_BATCH_TEST_JOB={uuid.uuid4().hex}"
  p = subprocess.Popen([sys.executable, "-m", "modeld_batch", *map(str, args), "--quiet"], cwd=REPO, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True, env={**env, **dict([marker.split("=")])}, start_new_session=True)
  p.marker = marker.encode()
  return p

def job_processes(p: subprocess.Popen, cmdline: str = "") -> list[int]:
  """The pids of p's processes (Ray's included) whose command line holds cmdline, p itself not counted."""
  pids = []
  for d in Path("/proc").iterdir():
    try:
      if d.name.isdigit() and int(d.name) != p.pid and p.marker in (d / "environ").read_bytes() and cmdline.encode() in (d / "cmdline").read_bytes():
        pids.append(int(d.name))
    except OSError: pass   # gone meanwhile
  return pids

def job_workers(p: subprocess.Popen) -> list[int]:
  """The pids of p's Ray worker processes that hold a SegmentWorker."""
  return job_processes(p, "ray::SegmentWorker")

@pytest.fixture(scope="module")
def routes(scene, tmp_path_factory) -> list[Path]:
  """Three short routes of two segments, each starting at another frame id."""
  d = tmp_path_factory.mktemp("routes")
  for i, name in enumerate(("a", "b", "c")): write_route(d / name, scene, segments=2, frames=FRAMES, first_frame_id=100 * (i + 1))
  return [d / n for n in ("a", "b", "c")]

def same(a: Path, b: Path) -> None:
  """Every compared field of every frame equal, and the same frames."""
  for d in compare(route_outputs(a)[0], route_outputs(b)[0]):
    assert (d.max, d.missing, d.extra) == (0, 0, 0) and d.frames > 0, (a, b, d)

ROAD_OUT, DRIVER_OUT = ("modelV2", "drivingModelData", "cameraOdometry"), ("driverStateV2", "driverMonitoringState")
STATES = {"road": "roadCameraState", "wide": "wideRoadCameraState", "driver": "driverCameraState"}
TIMINGS = {"modelExecutionTime", "gpuExecutionTime", "processingTime"}   # how long this run took: differ between any two runs

def messages(route: Path) -> dict[str, list]:
  """Per output and camera-state service, in log order, each message's valid flag and every field but TIMINGS."""
  out: dict[str, list] = {s: [] for s in (*ROAD_OUT, *DRIVER_OUT, *STATES.values())}
  for ev in LogReader(log_files(route, "a")):
    if (w := ev.which()) in out: out[w].append((ev.valid, {k: v for k, v in getattr(ev, w).to_dict().items() if k not in TIMINGS}))
  return out

@pytest.fixture(scope="module")
def lockstep_routes(scene, tmp_path_factory) -> Path:
  """Three routes, two with missing frames. gaps: road and driver, two segments; the road camera's frame 102 dropped
  by the encoder; segment 1 starts before its first calibration (frames 108-109: modelV2 invalid, driverStateV2 valid)
  and a broken one follows frame 110 (111-114: both invalid until the next good one). wide: road, wide road and
  driver, one segment; frame 503 dropped on every camera, 506 on the wide one only (its road frame cannot run alone).
  whole: road and driver, one segment, nothing missing."""
  d = tmp_path_factory.mktemp("lockstep")
  def broken_calibration(fid: int, t: int) -> list:
    if fid != 110: return []
    cal = event("liveCalibration", t, calPerc=100, rpyCalib=[9., 0., 0.])
    cal.liveCalibration.calStatus = "calibrated"
    return [cal]
  write_route(d / "gaps", scene, segments=2, frames=FRAMES, first_frame_id=100, missing={("road", 102)}, extra=broken_calibration)
  write_route(d / "wide", scene, cameras=("road", "wide", "driver"), segments=1, frames=FRAMES, first_frame_id=500,
              missing={*((c, 503) for c in STATES), ("wide", 506)})
  write_route(d / "whole", scene, segments=1, frames=FRAMES, first_frame_id=700)
  return d

# route: (summary, {segment: {camera: frames served}})
LOCKSTEP = {
  "gaps": (dict(segments=2, done=2, frames=2 * FRAMES, invalid=6, bad_output=0, lost=1, lost_why={"road: frame 102 has no roadEncodeIdx": 1}),
           {"gaps--0": {"road": FRAMES - 1, "driver": FRAMES}, "gaps--1": {"road": FRAMES, "driver": FRAMES}}),
  "wide": (dict(segments=1, done=1, frames=FRAMES - 1, invalid=0, bad_output=0, lost=5,
                lost_why={**{f"{c}: frame 503 has no {c.replace('wide', 'wideRoad')}EncodeIdx": 1 for c in STATES},
                          "wide: frame 506 has no wideRoadEncodeIdx": 1, "road: frame without its wide frame (lockstep serves them together)": 1}),
           {"wide--0": {"road": FRAMES - 2, "wide": FRAMES - 2, "driver": FRAMES - 1}}),
  "whole": (dict(segments=1, done=1, frames=FRAMES, invalid=0, bad_output=0, lost=0, lost_why={}), {"whole--0": {"road": FRAMES, "driver": FRAMES}}),
}

def test_batch_equals_the_daemons_in_lockstep(lockstep_routes, tmp_path):
  """One batch over three routes on two workers: every segment's outputs (modelV2, drivingModelData, cameraOdometry,
  driverStateV2, driverMonitoringState) and input camera states equal those of the live daemons fed the same segment
  by camerad --lockstep: the same messages, valid flags and frame ids, every field bit for bit but the execution times
  (each segment starts fresh in both). The routes miss frames: frame ids go on consecutively after a gap, as camerad's
  lockstep numbers them. The artifacts are built for aligned buffers only, not camerad's default: the batch takes the
  artifacts' layout (camerad is given --layout aligned). The summary counts, per route, frames, invalid frames (not
  outputs), lost frames with their reasons."""
  arts = build(CACHE.parent / "tiny-aligned", layouts=(ALT_LAYOUT,), models="tiny")
  r = batch(*(lockstep_routes / name for name in LOCKSTEP), "--artifacts", arts, "--out", tmp_path / "out", "--workers", 2)
  assert r.returncode == 0, r.stderr
  summary = {s["route"]: s for s in json.loads((tmp_path / "out" / "summary.json").read_text())["routes"]}
  for route, (want, _) in LOCKSTEP.items(): assert {k: summary[route][k] for k in want} == want and summary[route]["errors"] == [], summary[route]
  assert "bad out" in r.stdout and "wall time" in r.stdout and "lost 1: road: frame 102 has no roadEncodeIdx" in r.stdout, r.stdout
  for route, (_, served) in LOCKSTEP.items():
    for seg in sorted((lockstep_routes / route).iterdir()):
      counts = {**{STATES[c]: n for c, n in served[seg.name].items()}, **dict.fromkeys(ROAD_OUT, served[seg.name]["road"]),
                **dict.fromkeys(DRIVER_OUT, served[seg.name]["driver"])}
      # daemons started for the segment, as the batch starts each one: a running daemon would keep the last one's
      # calibration and messages across camerad's restart
      daemons, notify, col = [Daemon(m, arts) for m in ("modeld", "dmonitoringd")], Notify(), Collector([*ROAD_OUT, *DRIVER_OUT])
      try:
        rec = subprocess.Popen([sys.executable, "-m", "modeld_tools.record", "--route", tmp_path / "live" / seg.name, "--stats-interval", "0"],
                               cwd=REPO, env={**os.environ, "NOTIFY_SOCKET": notify.addr})
        notify.wait("READY=1", 20)
        lockstep(seg, col, "--layout", "aligned")
        for svc, n in counts.items(): notify.wait_count(svc, n)   # recorded: a stop now loses nothing
        rec.send_signal(signal.SIGTERM)
        assert rec.wait(20) == 0
      finally:
        for d in daemons: d.stop()
        col.close()
        notify.close()
      live, out = messages(tmp_path / "live" / seg.name), messages(tmp_path / "out" / route / seg.name)
      assert {svc: len(m) for svc, m in out.items() if m} == counts, seg.name
      ids = [m["frameId"] for _, m in out["modelV2"]]
      assert ids == list(range(ids[0], ids[0] + len(ids))), (seg.name, ids)   # consecutive across the gap, as lockstep serves them
      for svc in out: assert live[svc] == out[svc], f"{seg.name} {svc}"

def test_outputs_are_on_the_recorded_clock(routes, tiny_artifacts, tmp_path):
  """An output segment is on its source's clock, as its EncodeIdx events are: every event within the source segment's
  time span, each camera state at the time its frame's state was recorded, each output at the time of the frame it
  answers (so plots and overlays line the outputs up with the source route, however long after it the batch ran)."""
  assert batch(routes[0], "--artifacts", tiny_artifacts, "--out", tmp_path / "out").returncode == 0
  for src in sorted(routes[0].iterdir()):
    recorded = {(ev.which(), getattr(ev, ev.which()).frameId): ev.logMonoTime for ev in LogReader(log_files(src, "a"))
                if ev.which() in STATES.values()}
    times = [ev.logMonoTime for ev in LogReader(log_files(src, "a"))]
    span = (min(times), max(times))
    evs = list(LogReader(log_files(tmp_path / "out" / "a" / src.name, "a")))
    assert evs[0].which() == "initData" and evs[0].logMonoTime == span[0], (evs[0].which(), evs[0].logMonoTime, span)
    outside = [(ev.which(), ev.logMonoTime) for ev in evs if not span[0] <= ev.logMonoTime <= span[1]]
    assert not outside, f"{src.name}: expected every event within the source's {span}, got {outside[:5]} ({len(outside)} outside)"
    frame_t = {}   # (camera state service, output frame id) -> its time
    for ev in evs:
      if (w := ev.which()) in STATES.values():
        st = getattr(ev, w)
        assert ev.logMonoTime == recorded[w, st.frameIdSensor], (src.name, w, st.frameIdSensor)
        frame_t[w, st.frameId] = ev.logMonoTime
    answers = {**dict.fromkeys(ROAD_OUT, "roadCameraState"), "driverStateV2": "driverCameraState"}
    got, last_driver = Counter(), None
    for ev in evs:
      if (w := ev.which()) in answers:
        assert ev.logMonoTime == frame_t[answers[w], getattr(ev, w).frameId], (src.name, w, getattr(ev, w).frameId)
        got[w] += 1
      elif w == "driverMonitoringState":   # no frame id: it follows its driverStateV2, at its time
        got[w] += 1
        assert ev.logMonoTime == last_driver, (src.name, ev.logMonoTime, last_driver)
      if w == "driverStateV2": last_driver = ev.logMonoTime
    assert got == dict.fromkeys((*ROAD_OUT, *DRIVER_OUT), FRAMES), (src.name, got)

def test_a_camera_restarted_in_a_segment_keeps_each_frame_its_time(scene, tiny_artifacts, tmp_path):
  """A segment whose cameras restarted (frame ids 100.. again): each frame's camera state and outputs keep the time
  its own state was recorded at, not that of the later frame with the same id."""
  write_route(src := tmp_path / "r", scene, segments=1, frames=FRAMES, restart=FRAMES // 2)
  assert batch(src, "--artifacts", tiny_artifacts, "--out", tmp_path / "out").returncode == 0
  def times(route: Path) -> dict[str, list[int]]:
    return {w: [ev.logMonoTime for ev in LogReader(log_files(route, "a")) if ev.which() == w] for w in ("roadCameraState", "modelV2")}
  recorded, got = times(src / "r--0")["roadCameraState"], times(tmp_path / "out" / "r" / "r--0")
  assert len(set(recorded)) == FRAMES and got == {"roadCameraState": recorded, "modelV2": recorded}, (recorded, got)

def test_outputs_that_cannot_be_parsed_are_counted(routes, tmp_path):
  """A driver-monitoring model whose outputs the daemon cannot parse (its manifest's face_descs_lhd slice 10 wide):
  every driver frame is skipped and counted as bad_output, the segments still complete (each starts its own count
  of failures in a row, under the daemon's limit here)."""
  arts = build(CACHE.parent / "tiny-both-face_descs_lhd-10", models="tiny", widths=(("face_descs_lhd", 10),))
  r = batch(routes[0], "--artifacts", arts, "--out", tmp_path / "out")
  assert r.returncode == 0, r.stderr
  (s,) = json.loads((tmp_path / "out" / "summary.json").read_text())["routes"]
  assert (s["done"], s["frames"], s["bad_output"], s["errors"]) == (2, 2 * FRAMES, 2 * FRAMES, []), s
  assert not messages(tmp_path / "out" / "a" / "a--0")["driverStateV2"] and messages(tmp_path / "out" / "a" / "a--0")["modelV2"]

def test_a_segment_range_after_a_route_picks_its_segments(routes, tiny_artifacts, tmp_path):
  """ROUTE/-1, as openpilot names a route's last segment: that segment alone is run, under its own name."""
  r = batch(f"{routes[1]}/-1", "--artifacts", tiny_artifacts, "--out", tmp_path / "out")
  assert r.returncode == 0, r.stderr
  (s,) = json.loads((tmp_path / "out" / "summary.json").read_text())["routes"]
  assert (s["route"], s["segments"], s["done"], s["frames"]) == ("b", 1, 1, FRAMES) and os.listdir(tmp_path / "out" / "b") == ["b--1"], s

def test_killed_worker_is_retried_with_identical_results(scene, tiny_artifacts, tmp_path):
  """A worker SIGKILLed in the middle of a segment: a new worker runs the segment again, and the summary says so; no
  partial output is left, and every output equals that of a run without the kill."""
  long = tmp_path / "long"
  write_route(long, scene, segments=2, frames=60)
  r = batch(long, "--artifacts", tiny_artifacts, "--out", tmp_path / "clean", "--workers", 1)
  assert r.returncode == 0, r.stderr
  p = start_batch(long, "--artifacts", tiny_artifacts, "--out", tmp_path / "killed", "--workers", 1)
  try:
    deadline = time.monotonic() + 120
    while not list((tmp_path / "killed" / "long").glob(".long--*.tmp")):   # a segment in progress
      assert p.poll() is None and time.monotonic() < deadline, p.communicate()
      time.sleep(0.005)
    assert (pids := job_workers(p)), "no Ray worker process of this job holding a SegmentWorker"
    for pid in pids: os.kill(pid, signal.SIGKILL)
    out, err = p.communicate(timeout=300)
  finally:
    if p.poll() is None: p.kill()
  assert p.returncode == 0, err
  assert not list((tmp_path / "killed").rglob("*.tmp")) and sorted(os.listdir(tmp_path / "killed" / "long")) == ["long--0", "long--1"]
  (s,) = json.loads((tmp_path / "killed" / "summary.json").read_text())["routes"]
  assert (s["done"], s["rerun"], s["rerun_why"]) == (2, 1, {"worker lost: its process died": 1}), s
  assert "run again 1 time(s): worker lost: its process died" in out, out
  same(tmp_path / "clean" / "long", tmp_path / "killed" / "long")

def test_corrupt_segment_is_reported_the_rest_finish_and_resume(routes, tiny_artifacts, tmp_path):
  """One segment's video damaged, another's log garbage: both reported with their error in the summary (exit 1),
  every other segment done. A re-run with --resume skips the done ones; without it the output folder is refused."""
  src = tmp_path / "src"
  for r in routes[:2]: shutil.copytree(r, src / r.name)
  (src / "a" / "a--1" / "fcamera.hevc").write_bytes(b"\x00\x00\x01" + os.urandom(2000))
  (src / "b" / "b--0" / "rlog.zst").write_bytes(os.urandom(3000))
  r = batch(src / "a", src / "b", "--artifacts", tiny_artifacts, "--out", tmp_path / "out", "--workers", 2)
  assert r.returncode == 1, r.stderr
  summary = {s["route"]: s for s in json.loads((tmp_path / "out" / "summary.json").read_text())["routes"]}
  assert summary["a"]["done"] == 1 and summary["b"]["done"] == 1 and all(len(summary[k]["errors"]) == 1 for k in "ab"), summary
  assert summary["a"]["errors"][0].startswith("a--1: ") and summary["b"]["errors"][0].startswith("b--0: ")
  assert "failed: a--1" in r.stdout and "failed: b--0" in r.stdout
  r = batch(src / "a", src / "b", "--artifacts", tiny_artifacts, "--out", tmp_path / "out")
  assert r.returncode == 1 and "--resume" in r.stderr
  shutil.copytree(routes[1] / "b--0", src / "b" / "b--0", dirs_exist_ok=True)   # the log repaired
  r = batch(src / "a", src / "b", "--artifacts", tiny_artifacts, "--out", tmp_path / "out", "--resume")
  summary = {s["route"]: s for s in json.loads((tmp_path / "out" / "summary.json").read_text())["routes"]}
  assert (summary["b"]["resumed"], summary["b"]["done"], summary["b"]["errors"]) == (1, 1, []), summary
  assert (summary["a"]["resumed"], summary["a"]["done"], len(summary["a"]["errors"])) == (1, 0, 1), summary

def test_a_route_without_driver_video_runs_the_road_model_and_says_so(routes, tiny_artifacts, tmp_path):
  """openpilot records dcamera.hevc only with RecordFront on, and logs the driver camera's states and EncodeIdx
  all the same: the road model runs on every frame, the driver model on none, and the summary says why (exit 0)."""
  src = shutil.copytree(routes[0], tmp_path / "src" / "a")
  for seg in ("a--0", "a--1"): (src / seg / "dcamera.hevc").unlink()
  r = batch(src, "--artifacts", tiny_artifacts, "--out", tmp_path / "out")
  assert r.returncode == 0, r.stderr
  (summary,) = json.loads((tmp_path / "out" / "summary.json").read_text())["routes"]
  assert (summary["done"], summary["errors"]) == (2, []) and summary["unserved"] == {"driver: no dcamera.hevc for the driver camera's indexed frames": 2}
  assert "not run in 2 segment(s): driver: no dcamera.hevc" in r.stdout
  services = Counter(ev.which() for ev in LogReader(str(tmp_path / "out" / "a")))
  assert services["modelV2"] == services["roadCameraState"] == summary["frames"] > 0 and services["driverStateV2"] == 0, services

@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_ctrl_c_or_sigterm_stops_cleanly_and_resume_finishes(sig, scene, tiny_artifacts, tmp_path):
  """Ctrl-C (SIGINT to the job's process group, as a terminal sends it) or SIGTERM (to the driver alone, as kill,
  timeout or a container's stop send it) while a segment is in progress: exit 128 + the signal, no temporary output
  left, no worker of it left running, a summary.json that says the job was interrupted (no crash dump of Ray's);
  --resume completes the rest, its summary counts every segment, and the outputs equal a run never interrupted."""
  long = tmp_path / "long"
  write_route(long, scene, segments=3, frames=40)
  p = start_batch(long, "--artifacts", tiny_artifacts, "--out", tmp_path / "out", "--workers", 1)
  try:
    deadline = time.monotonic() + 120   # one segment done, the next in progress
    while not ((tmp_path / "out" / "long" / "long--0").exists() and list((tmp_path / "out" / "long").glob(".long--*.tmp"))):
      assert p.poll() is None and time.monotonic() < deadline, p.communicate()
      time.sleep(0.005)
    if sig == signal.SIGINT: os.killpg(p.pid, sig)   # a terminal's Ctrl-C: the driver and every process of its group
    else: p.send_signal(sig)
    out, err = p.communicate(timeout=60)
  finally:
    if p.poll() is None: p.kill()
  assert p.returncode == 128 + sig and f"interrupted ({sig.name})" in err and "received at" not in err, (p.returncode, err)
  assert not list((tmp_path / "out").rglob("*.tmp"))
  summary = json.loads((tmp_path / "out" / "summary.json").read_text())
  (s,) = summary["routes"]
  assert summary["interrupted"] is True and 1 <= s["done"] < 3 and s["frames"] == 40 * s["done"], summary
  assert f"interrupted ({sig.name}): {3 - s['done']} segment(s) not run" in out and "(raylet)" not in out, out   # the table alone
  deadline = time.monotonic() + 10   # Ray's shutdown ends its workers as it goes
  while job_workers(p) and time.monotonic() < deadline: time.sleep(0.1)
  assert not job_workers(p), "a worker outlived the interrupted job"
  r = batch(long, "--artifacts", tiny_artifacts, "--out", tmp_path / "out", "--resume")
  assert r.returncode == 0, r.stderr
  assert sorted(os.listdir(tmp_path / "out" / "long")) == ["long--0", "long--1", "long--2"]
  summary = json.loads((tmp_path / "out" / "summary.json").read_text())
  assert summary["interrupted"] is False and summary["routes"][0]["frames"] == 3 * 40 and summary["routes"][0]["resumed"] == s["done"], summary
  r = batch(long, "--artifacts", tiny_artifacts, "--out", tmp_path / "whole")
  same(tmp_path / "whole" / "long", tmp_path / "out" / "long")

def test_ctrl_c_while_ray_starts_leaves_no_process(routes, tiny_artifacts, tmp_path):
  """Ctrl-C while ray.init() starts a local Ray (its raylet up, the driver not yet connected): Ray's start-up is let
  finish and then shut down, so no process of the job outlives it (cut short, it left Ray's agents running); exit 130,
  and the summary counts the time as Ray's start-up, not the workers'."""
  p = start_batch(routes[0], "--artifacts", tiny_artifacts, "--out", tmp_path / "out", "--workers", 1)
  try:
    deadline = time.monotonic() + 120
    while not job_processes(p, "raylet/raylet"):   # the raylet binary, started by ray.init()
      assert p.poll() is None and time.monotonic() < deadline, p.communicate()
      time.sleep(0.005)
    os.killpg(p.pid, signal.SIGINT)
    out, err = p.communicate(timeout=120)
  finally:
    if p.poll() is None: p.kill()
  assert p.returncode == 130 and "interrupted (SIGINT)" in err and "ray: local" not in err, (p.returncode, err)
  summary = json.loads((tmp_path / "out" / "summary.json").read_text())
  assert summary["interrupted"] is True and summary["ray_s"] > 0 and summary["start_s"] == summary["job_s"] == 0, summary
  deadline = time.monotonic() + 30   # ray.shutdown() has stopped them; the last may still be exiting
  while job_processes(p) and time.monotonic() < deadline: time.sleep(0.1)
  assert not (left := job_processes(p)), f"expected no process of the job left, got pids {left}"

def test_diff_lists_the_largest_changes(routes, tiny_artifacts, tmp_path):
  """Two batch outputs of other models (the tiny ONNX models and the reference models): diff prints each field's
  differences and the frames that changed most, with the modeld-overlay command to see one."""
  ref = build()   # the reference models, shared with the other tests
  for name, art in (("tiny", tiny_artifacts), ("ref", ref)):
    assert batch(routes[0], "--artifacts", art, "--out", tmp_path / name).returncode == 0
  r = subprocess.run([sys.executable, "-m", "modeld_batch", "diff", tmp_path / "tiny", tmp_path / "ref", "--top", "3"], cwd=REPO, capture_output=True,
                     text=True, env=ENV)
  assert r.returncode == 0, r.stderr
  assert "modelV2.position" in r.stdout and "largest changes at frame" in r.stdout and f"modeld-overlay {tmp_path / 'ref' / 'a'} --start" in r.stdout
  r = subprocess.run([sys.executable, "-m", "modeld_batch", "diff", tmp_path / "tiny", tmp_path / "tiny"], cwd=REPO, capture_output=True, text=True, env=ENV)
  assert r.returncode == 0 and "largest changes" not in r.stdout and "only in" not in r.stdout

def test_diff_reports_what_it_cannot_compare(routes, tiny_artifacts, tmp_path):
  """A route in one output only is named, the shared ones compared; a folder that is not there is a one-line error;
  so is a route one side has no model outputs of (the source routes given for an output: exit 1, not 0 frames
  compared); --top 0 is refused."""
  assert batch(routes[0], "--artifacts", tiny_artifacts, "--out", tmp_path / "one").returncode == 0
  shutil.copytree(tmp_path / "one", tmp_path / "two")
  shutil.copytree(tmp_path / "one" / "a", tmp_path / "one" / "z")
  def diff(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "modeld_batch", "diff", *map(str, args)], cwd=REPO, capture_output=True, text=True, env=ENV)
  r = diff(tmp_path / "one", tmp_path / "two")
  assert r.returncode == 0 and f"only in {tmp_path / 'one'} (not compared): z" in r.stdout and "modelV2.position" in r.stdout, r.stdout
  r = diff(tmp_path / "one", tmp_path / "nowhere")
  assert r.returncode == 1 and f"no such folder: {tmp_path / 'nowhere'}" in r.stderr and "Traceback" not in r.stderr, r.stderr
  r = diff(tmp_path / "one", routes[0].parent)
  assert r.returncode == 1 and f"a: expected model outputs on both sides, got {tmp_path / 'one' / 'a'}: {2 * 2 * FRAMES} modelV2 and " in r.stderr, r.stderr
  assert f"{routes[0]}: 0 modelV2 and driverStateV2 messages" in r.stderr and "1 of 1 routes not compared: a" in r.stderr, r.stderr
  (tmp_path / "two" / "a" / "a--1").rename(tmp_path / "two" / "a" / "x")   # no segment left: not a route
  shutil.rmtree(tmp_path / "two" / "a" / "a--0")
  r = diff(tmp_path / "one", tmp_path / "two")
  assert r.returncode == 1 and f"a: expected model outputs on both sides, got {tmp_path / 'two' / 'a'}: expected a log file" in r.stderr, r.stderr
  r = diff(tmp_path / "one", tmp_path / "one", "--top", 0)
  assert r.returncode == 2 and "--top: expected >= 1, got 0" in r.stderr, r.stderr

@pytest.fixture(scope="module")
def one_segment(routes, tiny_artifacts, tmp_path_factory) -> Path:
  """A complete batch output of one segment."""
  out = tmp_path_factory.mktemp("one") / "out"
  r = batch(f"{routes[1]}/-1", "--artifacts", tiny_artifacts, "--out", out)
  assert r.returncode == 0, r.stderr
  return out

def test_resume_with_everything_done_starts_nothing(routes, tiny_artifacts, one_segment, tmp_path):
  """--resume where every segment is complete: no Ray and no worker started (their times are 0), the summary says
  so, exit 0, and still counts what the first run counted (from the counts beside each segment's output). A segment
  without them (an older modeld-batch's output) is counted as such, not as 0 frames."""
  shutil.copytree(one_segment, out := tmp_path / "out", symlinks=True)
  (first,) = json.loads((one_segment / "summary.json").read_text())["routes"]
  r = batch(f"{routes[1]}/-1", "--artifacts", tiny_artifacts, "--out", out, "--resume")
  assert r.returncode == 0, r.stderr
  summary = json.loads((out / "summary.json").read_text())
  assert {k: summary[k] for k in ("ray_s", "start_s", "job_s")} == dict.fromkeys(("ray_s", "start_s", "job_s"), 0), summary
  (s,) = summary["routes"]
  assert (s["segments"], s["resumed"], s["done"], s["errors"], summary["interrupted"]) == (1, 1, 0, [], False), s
  assert s == {**first, "done": 0, "resumed": 1} and s["frames"] == FRAMES, (first, s)
  assert "all 1 segments were already done" in r.stdout and f" {FRAMES} " in r.stdout.splitlines()[1], r.stdout
  from modeld_batch.segment import COUNTS
  (out / "b" / "b--1" / COUNTS).unlink()
  r = batch(f"{routes[1]}/-1", "--artifacts", tiny_artifacts, "--out", out, "--resume")
  (s,) = json.loads((out / "summary.json").read_text())["routes"]
  assert r.returncode == 0 and (s["resumed"], s["unrecorded"], s["frames"]) == (1, 1, 0), (r.stderr, s)
  assert "1 resumed segment(s) without their counts" in r.stdout, r.stdout

def test_threads_give_the_same_outputs(routes, tiny_artifacts, one_segment, tmp_path):
  """--threads 2: a worker of two cores, its models' kernel launches and its decoding shared out to two threads, writes
  the same messages and counts as a worker of one (one_segment)."""
  r = batch(f"{routes[1]}/-1", "--artifacts", tiny_artifacts, "--out", tmp_path / "out", "--workers", 1, "--threads", 2)
  assert r.returncode == 0 and "1 workers of 2 core(s)" in r.stderr, r.stderr
  assert_same_output(tmp_path / "out", one_segment)

def test_a_second_device_gives_the_same_outputs_and_gpus_must_be_there(routes, device_artifacts, one_segment, tmp_path):
  """Artifacts built for CPU:1 (a device that is no host memory, as a GPU's): the workers load them on that device and
  write the same messages as on the CPU. --gpus-per-worker asks Ray for GPUs: where it sees none, the job says so."""
  r = batch(f"{routes[1]}/-1", "--artifacts", device_artifacts, "--out", tmp_path / "out", "--workers", 1)
  assert r.returncode == 0, r.stderr
  assert_same_output(tmp_path / "out", one_segment)
  r = batch(f"{routes[1]}/-1", "--artifacts", device_artifacts, "--out", tmp_path / "gpu", "--gpus-per-worker", 0.5)
  assert r.returncode == 1 and "--gpus-per-worker 0.5: a worker takes that much of one node's GPUs, the cluster's nodes have 0" in r.stderr, r.stderr
  r = batch(f"{routes[1]}/-1", "--artifacts", device_artifacts, "--out", tmp_path / "gpu", "--gpus-per-worker", -1)
  assert r.returncode == 2 and "--gpus-per-worker: expected 0 <= F <= 64, got -1" in r.stderr, r.stderr

def to_closed_pipe(*args: object, buffered: bool) -> subprocess.CompletedProcess:
  """modeld-batch with its stdout a pipe whose reader is gone before it writes (`| head` that has read enough).
  buffered: stdout buffered, as Python has it on a pipe (the error comes when the buffer is written, at the latest at
  exit), or unbuffered (PYTHONUNBUFFERED=1: at each print)."""
  rd, wr = os.pipe()
  os.close(rd)
  env = {k: v for k, v in ENV.items() if k != "PYTHONUNBUFFERED"} | ({} if buffered else {"PYTHONUNBUFFERED": "1"})
  try: return subprocess.run([sys.executable, "-m", "modeld_batch", *map(str, args)], cwd=REPO, stdout=wr, stderr=subprocess.PIPE,
                             text=True, env=env, timeout=120)
  finally: os.close(wr)

@pytest.mark.parametrize("buffered", [True, False], ids=["buffered", "unbuffered"])
def test_a_reader_that_leaves_ends_the_output_quietly(buffered, routes, tiny_artifacts, one_segment, tmp_path):
  """`modeld-batch ... | head`: each command that prints to stdout (diff, --help, a job's summary) ends without an
  error when its reader has gone; the job keeps its exit status and writes its summary.json all the same."""
  r = to_closed_pipe("diff", one_segment, one_segment, "--top", 2, buffered=buffered)
  assert (r.returncode, r.stderr) == (0, ""), r.stderr
  r = to_closed_pipe("--help", buffered=buffered)
  assert (r.returncode, r.stderr) == (0, ""), r.stderr
  shutil.copytree(one_segment, out := tmp_path / "out", symlinks=True)
  (out / "summary.json").unlink()
  r = to_closed_pipe(f"{routes[1]}/-1", "--artifacts", tiny_artifacts, "--out", out, "--resume", buffered=buffered)
  assert (r.returncode, r.stderr) == (0, ""), r.stderr
  assert json.loads((out / "summary.json").read_text())["routes"][0]["resumed"] == 1

def free_port() -> int:
  """A TCP port nothing listens on (the kernel's pick for a socket closed at once)."""
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]

def test_an_unreachable_cluster_is_an_error_naming_it(routes, tiny_artifacts, tmp_path):
  """--address where nothing listens: exit 1 at once with the address named, not Ray retrying it for minutes."""
  address = f"127.0.0.1:{free_port()}"
  r = batch(routes[0], "--artifacts", tiny_artifacts, "--out", tmp_path / "out", "--address", address, timeout=60)
  assert r.returncode == 1 and f"no Ray cluster answers at {address}" in r.stderr, r.stderr
  assert not (tmp_path / "out").exists()

def syn_sent_to(port: int) -> bool:
  """A TCP connection to port on its way (SYN sent, no answer yet), from any process, over IPv4 or IPv6 (Ray's own
  connections are IPv6 sockets): state 02 in /proc/net/tcp or tcp6."""
  lines = [l for f in ("tcp", "tcp6") for l in Path(f"/proc/net/{f}").read_text().splitlines()[1:]]
  return any(f[3] == "02" and int(f[2].split(":")[1], 16) == port for f in map(str.split, lines))

@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_sigterm_and_ctrl_c_stop_the_wait_for_a_cluster(sig, routes, tiny_artifacts, tmp_path):
  """An address that never answers (a listener whose queue is full drops the connection's SYN): the job waits for it at
  most CONNECT_TIMEOUT_S, and SIGTERM (as `timeout` or systemd send it) or Ctrl-C ends the wait at once: exit 128 + the
  signal (143, 130), not the error the wait would end in (exit 1)."""
  from modeld_batch.main import CONNECT_TIMEOUT_S
  with socket.socket() as listener:
    listener.bind(("0.0.0.0", 0))   # all addresses: Ray takes 127.0.0.1 for this node's own IP address
    listener.listen(0)
    port, queued = listener.getsockname()[1], []
    while True:   # fill the accept queue: from then on the kernel drops new connections' SYNs
      c = socket.socket()
      c.settimeout(0.5)
      try: c.connect(("127.0.0.1", port))
      except TimeoutError:
        c.close()   # no longer a connection on its way: the only one from now on is the job's
        break
      queued.append(c)
    p = start_batch(routes[0], "--artifacts", tiny_artifacts, "--out", tmp_path / "out", "--address", f"127.0.0.1:{port}")
    try:
      deadline = time.monotonic() + 60
      while not syn_sent_to(port):
        assert p.poll() is None, p.communicate()   # it ended: its output says why
        assert time.monotonic() < deadline, f"expected a connection to port {port} within 60 s, got none"
        time.sleep(0.01)
      t = time.monotonic()
      if sig == signal.SIGINT: os.killpg(p.pid, sig)   # a terminal's Ctrl-C, to the whole process group
      else: p.send_signal(sig)
      out, err = p.communicate(timeout=60)
    finally:
      if p.poll() is None: p.kill()
      for c in queued: c.close()
  assert p.returncode == 128 + sig, (p.returncode, err)
  assert time.monotonic() - t < CONNECT_TIMEOUT_S, err

def test_artifacts_for_other_cameras_are_refused_before_ray_starts(routes, tiny_artifacts, tmp_path):
  """Artifacts with no layout of a route's camera size: exit 1 before Ray starts, naming the camera, its size, the
  artifact's layouts and the command that adds one (the check reads the manifests alone)."""
  from modelrt.artifact import warp_name
  arts = tmp_path / "arts"
  for family in ("road", "dm"):
    manifest = json.loads((tiny_artifacts / family / "manifest.json").read_text())
    if family == "dm":   # built for another camera size alone: its warp under that layout's name, its frame input of that layout
      manifest["jits"][warp_name(str(UNSERVED_LAYOUT))] = warp = manifest["jits"].pop(warp_name(manifest["layouts"][0]))
      next(i for i in warp["inputs"] if i["name"] == "frame")["layout"] = str(UNSERVED_LAYOUT)
      manifest["layouts"] = [str(UNSERVED_LAYOUT)]
    (arts / family).mkdir(parents=True)
    (arts / family / "manifest.json").write_text(json.dumps(manifest))
  r = batch(routes[0], "--artifacts", arts, "--out", tmp_path / "out", timeout=60)
  assert r.returncode == 1 and f"the driver camera is 64x48, {arts / 'dm'} was built for {UNSERVED_LAYOUT}" in r.stderr, r.stderr
  assert "--camera 64x48" in r.stderr and "ray:" not in r.stderr and not (tmp_path / "out").exists(), r.stderr

def test_without_ray_installed_says_which_extra(routes, tiny_artifacts, tmp_path):
  """The base install has no Ray: exit 2 with the install command, no traceback. (Ray is made unimportable in the
  child as Python does for a module it cannot find.)"""
  code = "import sys; sys.modules['ray'] = None; from modeld_batch.main import main; sys.exit(main())"
  r = subprocess.run([sys.executable, "-c", code, routes[0], "--artifacts", tiny_artifacts, "--out", tmp_path / "out"], cwd=REPO,
                     capture_output=True, text=True, env=ENV, timeout=60)
  assert r.returncode == 2 and "pip install 'tinymodeld[batch]'" in r.stderr and "Traceback" not in r.stderr, r.stderr

def test_cluster_launcher_config_is_one_ray_up_takes():
  """modeld_batch/cluster.yaml, the cluster docs/BATCH.md runs the job on: Ray's own bootstrap of a `ray up` (its
  defaults, its schema, the local provider's checks) accepts it, every listed machine a node."""
  import yaml
  from ray.autoscaler._private.commands import _bootstrap_config
  c = _bootstrap_config(yaml.safe_load((REPO / "modeld_batch" / "cluster.yaml").read_text()), no_config_cache=True)
  assert c["provider"]["type"] == "local" and c["max_workers"] == len(c["provider"]["worker_ips"]), c
  assert all("RAY_AUTH_MODE=token" in cmd for cmd in c["head_start_ray_commands"] + c["worker_start_ray_commands"] if " start " in cmd)

class Cluster:
  """A Ray cluster of two nodes on this machine, as `ray start` makes one, one core each: a head and a worker node, each
  `ray start --block` in a session of its own, so that killing every process of the session (its raylet, its agents,
  its workers) is that node lost. Token authentication as Ray sets it up (RAY_AUTH_MODE=token, the token in a file
  RAY_AUTH_TOKEN_PATH names); its own temp dir and ports, so that no other Ray on the machine finds it or collides."""
  def __init__(self):
    self.dir = Path(tempfile.mkdtemp(prefix="rb", dir="/tmp"))   # short: Ray's socket paths under it must fit 107 bytes
    (self.dir / "token").write_text(secrets.token_hex(32))
    self.env = {**ENV, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(self.dir / "token")}
    self.address, self.nodes = f"127.0.0.1:{free_port()}", []
    self.start("--head", "--port", self.address.split(":")[1], "--include-dashboard", "false", "--dashboard-port", free_port())
    self.node = self.start("--address", self.address)

  def start(self, *args) -> subprocess.Popen:
    """A node started, once it says so (registered with the head)."""
    log, ports = self.dir / f"node{len(self.nodes)}.log", ("--node-manager-port", "--object-manager-port", "--dashboard-agent-listen-port",
                                                          "--dashboard-agent-grpc-port", "--runtime-env-agent-port", "--metrics-export-port")
    p = subprocess.Popen([Path(sys.executable).parent / "ray", "start", "--block", "--num-cpus", "1", "--temp-dir", self.dir / f"node{len(self.nodes)}",
                          "--disable-usage-stats", "--min-worker-port", "0", "--max-worker-port", "0", *(str(a) for o in ports for a in (o, free_port())),
                          *map(str, args)], env=self.env, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True)
    self.nodes.append(p)
    deadline = time.monotonic() + 60
    while "Ray runtime started" not in log.read_text():
      assert p.poll() is None and time.monotonic() < deadline, f"expected a Ray node started within 60 s, got:\n{log.read_text()}"
      time.sleep(0.1)
    return p

  def live_node(self) -> subprocess.Popen:
    """The worker node, started again where a test lost it."""
    if not self.processes(self.node): self.node = self.start("--address", self.address)
    return self.node

  @staticmethod
  def processes(node: subprocess.Popen) -> list[int]:
    """The pids of every process of node's session."""
    pids = []
    for d in Path("/proc").iterdir():
      try:
        if d.name.isdigit() and os.getsid(int(d.name)) == node.pid and (d / "stat").read_text().split(")")[1].split()[0] != "Z": pids.append(int(d.name))
      except OSError: pass   # gone meanwhile
    return pids

  def kill(self, node: subprocess.Popen) -> None:
    """The node lost: every process of its session SIGKILLed, until none is left."""
    deadline = time.monotonic() + 10
    while pids := self.processes(node):
      assert time.monotonic() < deadline, f"processes of the killed node still running: {pids}"
      for pid in pids:
        try: os.kill(pid, signal.SIGKILL)
        except OSError: pass
      time.sleep(0.01)
    node.wait(10)

  def stop(self) -> None:
    for node in self.nodes: self.kill(node)
    shutil.rmtree(self.dir, ignore_errors=True)

@pytest.fixture(scope="module")
def cluster():
  c = Cluster()
  try: yield c
  finally: c.stop()

@pytest.fixture(scope="module")
def node_loss_routes(scene, tmp_path_factory) -> list[Path]:
  """Two routes of two segments, long enough (60 frames) to kill a node in the middle of one."""
  d = tmp_path_factory.mktemp("node-loss")
  for name in ("a", "b"): write_route(d / name, scene, segments=2, frames=60)
  return [d / "a", d / "b"]

@pytest.fixture(scope="module")
def cluster_run(cluster, node_loss_routes, tiny_artifacts, tmp_path_factory) -> Path:
  """The routes' output on both nodes without a fault: what a run with one must equal."""
  out = tmp_path_factory.mktemp("clean") / "out"
  r = batch(*node_loss_routes, "--artifacts", tiny_artifacts, "--out", out, "--address", cluster.address, "--workers", 2, env=cluster.env)
  assert r.returncode == 0, r.stderr
  return out

def node_lost_during(cluster: Cluster, routes: list[Path], artifacts: Path, out: Path, when) -> tuple[str, str]:
  """The job on the cluster, its worker node killed once when(node's pids) holds; its stdout and stderr, once it exits 0."""
  node = cluster.live_node()
  p = start_batch(*routes, "--artifacts", artifacts, "--out", out, "--address", cluster.address, "--workers", 2, env=cluster.env)
  try:
    deadline = time.monotonic() + 120
    while not when(cluster.processes(node)):
      assert p.poll() is None and time.monotonic() < deadline, p.communicate()
      time.sleep(0.005)
    cluster.kill(node)
    stdout, stderr = p.communicate(timeout=300)
  finally:
    if p.poll() is None: p.kill()
  assert p.returncode == 0, stderr
  return stdout, stderr

def assert_same_output(out: Path, clean: Path) -> None:
  """out holds what clean does and nothing else (no temporary output), each segment's messages equal but for the
  run's timings, and its counts but for the times."""
  files = lambda d: sorted(str(f.relative_to(d)) for f in d.rglob("*"))
  assert files(out) == files(clean), f"expected {files(clean)}, got {files(out)}"
  for seg in clean.glob("*/*--*"):
    assert messages(out / seg.relative_to(clean)) == messages(seg), seg.name
    counts = [{k: v for k, v in json.loads((d / "counts.json").read_text()).items() if not k.endswith("_s")} for d in (out / seg.relative_to(clean), seg)]
    assert counts[0] == counts[1], (seg.name, counts)

def writes_a_segment(out: Path):
  """when(): one of the pids has a temporary output under out open (a worker in the middle of a segment)."""
  def when(pids: list[int]) -> bool:
    for pid in pids:
      try:
        if any(str(out) in (l := os.readlink(f)) and ".tmp/" in l for f in Path(f"/proc/{pid}/fd").iterdir()): return True
      except OSError: pass   # gone meanwhile
    return False
  return when

def starts_a_worker(pids: list[int]) -> bool:
  """when(): one of the pids is a SegmentWorker loading its artifacts."""
  for pid in pids:
    try:
      if Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"ray::SegmentWorker.__init__"): return True
    except OSError: pass
  return False

def test_a_node_lost_in_a_segment_costs_its_rerun_not_the_job(cluster, cluster_run, node_loss_routes, tiny_artifacts, tmp_path):
  """Two nodes, a worker each: the worker node killed (every process of it) while its worker writes a segment. The
  segment goes back to the queue and the head's worker runs it again (the dead worker's queued segment too, not
  counted as a re-run); the job exits 0, the summary says what was run again and why, nothing is left under OUT but
  the finished segments, and every segment's output equals that of the run without the fault."""
  out, err = node_lost_during(cluster, node_loss_routes, tiny_artifacts, tmp_path / "out", writes_a_segment(tmp_path / "out"))
  assert "back to the queue" in err, err
  summary = json.loads((tmp_path / "out" / "summary.json").read_text())
  assert [(s["done"], s["errors"]) for s in summary["routes"]] == [(2, [])] * 2, summary
  assert sum(s["rerun"] for s in summary["routes"]) == 1 and all(w.startswith("worker lost: ") for s in summary["routes"] for w in s["rerun_why"])
  assert "run again 1 time(s): worker lost: " in out, out
  assert_same_output(tmp_path / "out", cluster_run)

def test_a_node_lost_while_the_workers_start_fails_nothing(cluster, cluster_run, node_loss_routes, tiny_artifacts, tmp_path):
  """The worker node killed while its worker loads the artifacts: the head's worker runs every segment (the job does
  not wait for the lost one, which Ray reports only when it has missed the node's heartbeats); exit 0, the same
  output as without the fault, and nothing else under OUT."""
  node_lost_during(cluster, node_loss_routes, tiny_artifacts, tmp_path / "out", starts_a_worker)
  summary = json.loads((tmp_path / "out" / "summary.json").read_text())
  assert [(s["done"], s["errors"], s["rerun"]) for s in summary["routes"]] == [(2, [], 0)] * 2, summary
  assert_same_output(tmp_path / "out", cluster_run)

def test_more_threads_than_a_node_has_cores_is_refused(cluster, node_loss_routes, tiny_artifacts, tmp_path):
  """--threads 2 on a cluster whose nodes have one core each: no node could ever start such a worker, so the job exits
  1 at once, naming the largest node's cores, instead of waiting for one forever."""
  r = batch(*node_loss_routes, "--artifacts", tiny_artifacts, "--out", tmp_path / "out", "--address", cluster.address, "--threads", 2,
            env=cluster.env, timeout=120)
  assert r.returncode == 1 and "--threads 2: a worker takes that many cores of one node, expected at most the 1 " in r.stderr, r.stderr
  assert not list((tmp_path / "out").rglob("*--*")), "no segment should have started"
