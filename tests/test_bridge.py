"""camerad's bridge source against modeld-fakedevice, a comma device as openpilot's encoder and bridge serve it (HEVC
over TCP on the bridge's ports), all real processes: the daemons answer with the device's frame ids and their outputs
reach the device as its bridge pulls them; lost packets, a restarting device, one camera, a camera of another size,
a device that goes quiet, a camera that starts late, a camerad that falls behind: what is served stays current."""
import json, random, re, signal, subprocess, sys, threading, time
import pytest
import zmq
from cereal import messaging
from cereal.services import DAEMON_OUTPUTS
from msgq import tcp_port
from msgq.visionipc import DRIVER, ROAD, WIDE_ROAD, VisionIpcClient
from tests.artifacts import LAYOUT, REPO, UNSERVED_LAYOUT
from tests.daemon_harness import Collector, start_daemon

class Proc:
  """A child process (python -m MODULE ARGS), its output collected."""
  def __init__(self, module: str, *args: str):
    self.proc = subprocess.Popen([sys.executable, "-m", module, *map(str, args)], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    self.lines: list[str] = []
    threading.Thread(target=lambda: self.lines.extend(line.rstrip("\n") for line in self.proc.stdout), daemon=True).start()

  def output(self) -> str: return "\n".join(self.lines)

  def wait_for(self, pattern: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not re.search(pattern, self.output()):
      if self.proc.poll() is not None or time.monotonic() > deadline:
        why = f"exited {self.proc.returncode}" if self.proc.poll() is not None else f"not within {timeout} s"
        pytest.fail(f"{' '.join(self.proc.args[2:4])}: no {pattern!r} ({why}):\n{self.output()}")
      time.sleep(0.05)

  def stop(self) -> int:
    if self.proc.poll() is None: self.proc.send_signal(signal.SIGTERM)
    try: return self.proc.wait(10)
    except subprocess.TimeoutExpired:
      self.proc.kill()
      return self.proc.wait()

class DeviceIds(threading.Thread):
  """The frame ids the device sends on an EncodeData service, read as its bridge's subscribers read them."""
  def __init__(self, addr: str, service: str):
    super().__init__(daemon=True)
    self.addr, self.service, self.ids, self.done = addr, service, set(), threading.Event()
    self.start()
  def run(self) -> None:
    sock = zmq.Context.instance().socket(zmq.SUB)
    sock.setsockopt(zmq.SUBSCRIBE, b"")
    sock.setsockopt(zmq.RCVTIMEO, 100)
    sock.connect(f"tcp://{self.addr}:{tcp_port(self.service, '')}")
    while not self.done.is_set():
      try: self.ids.add(getattr(messaging.log_from_bytes(sock.recv()), self.service).idx.frameId)
      except zmq.Again: pass
    sock.close(0)
  def stop(self) -> set[int]:
    self.done.set()
    self.join(5)
    return self.ids

@pytest.fixture
def addr() -> str:
  """A loopback address of this test's own: the bridge's ports are fixed (openpilot's), so a parallel run must use another."""
  return f"127.{random.randint(1, 254)}.{random.randint(1, 254)}.{random.randint(2, 254)}"

@pytest.fixture
def procs():
  out: list[Proc] = []
  yield out
  for p in reversed(out): p.stop()

def device(procs: list, scene, addr: str, *args: str) -> Proc:
  procs.append(d := Proc("modeld_tools.fakedevice", "--source", f"synthetic:{scene}", "--bind", addr, "--clip", "20", *args))
  d.wait_for("modeld-fakedevice: serving")
  return d

def camerad(procs: list, addr: str, *args: str) -> Proc:
  procs.append(c := Proc("camerad", "--source", f"bridge:{addr}", *args))
  c.wait_for("camerad: serving")
  return c

def test_the_daemons_answer_with_the_devices_frame_ids_and_the_device_pulls_their_outputs(scene, tiny_artifacts, addr, procs, monkeypatch):
  """camerad serves the device's three cameras, with the device's frame ids, in the artifacts' layout; modeld and
  dmonitoringd answer them. With MSGQ_TCP their five outputs are on TCP, where openpilot's bridge on the device pulls
  them: a plain ZMQ SUB per service at msgq's port for it (openpilot's own, with no OPENPILOT_PREFIX)."""
  monkeypatch.setenv("MSGQ_TCP", "1")
  device(procs, scene, addr)
  camerad(procs, addr, "--artifacts", tiny_artifacts)
  assert VisionIpcClient.available_streams("camerad", False) == {ROAD, WIDE_ROAD, DRIVER}
  sent = {s: DeviceIds(addr, s) for s in ("roadEncodeData", "driverEncodeData")}
  pulled = {s: zmq.Context.instance().socket(zmq.SUB) for s in DAEMON_OUTPUTS}   # the device's bridge, pulling
  for s, sock in pulled.items():
    sock.setsockopt(zmq.SUBSCRIBE, b"")
    sock.setsockopt(zmq.RCVTIMEO, 30_000)
    sock.connect(f"tcp://127.0.0.1:{tcp_port(s)}")
  out, daemons = Collector(["modelV2", "driverStateV2"]), []
  try:
    daemons = [start_daemon(d, tiny_artifacts) for d in ("modeld", "dmonitoringd")]
    models, states = out.wait("modelV2", 20, 30), out.wait("driverStateV2", 20, 30)
    got = {s: messaging.log_from_bytes(sock.recv(), expect=s) for s, sock in pulled.items()}
  finally:
    out.close()
    for sock in pulled.values(): sock.close(0)
    for d, n in daemons: d.stop(); n.close()
  road, driver = (sent[s].stop() for s in ("roadEncodeData", "driverEncodeData"))
  ids = [m.modelV2.frameId for m in models]
  assert ids == sorted(ids) and set(ids) <= road, (ids, sorted(road))
  assert {m.driverStateV2.frameId for m in states} <= driver
  assert got["modelV2"].modelV2.frameId in road and got["driverStateV2"].driverStateV2.frameId in driver   # what the device got back
  assert {s: ev.which() for s, ev in got.items()} == {s: s for s in DAEMON_OUTPUTS}

def served(seconds: float, service: str = "roadCameraState") -> list[tuple[int, float]]:
  """(frame id, age in s at its arrival here) of each camera state camerad serves for a while, in order. The fake
  device's clock is this machine's, so the age is from the device's end of frame."""
  out, deadline, got = Collector([service]), time.monotonic() + seconds, []
  try:
    while time.monotonic() < deadline:
      out.poll()
      got += [(getattr(m, service).frameId, (time.monotonic_ns() - getattr(m, service).timestampEof) / 1e9) for m in out.msgs[service]]
      out.msgs[service].clear()
      time.sleep(0.01)
  finally: out.close()
  return got

def served_ids(seconds: float) -> list[int]:
  return [i for i, _ in served(seconds)]

def test_lost_packets_and_a_restarting_device_never_serve_a_picture_from_a_missing_reference(scene, addr, procs):
  """Every 7th packet of each camera lost on the way, the device restarting every 50 frames (frame ids and encodeIds
  from 0 again): a frame is served only if no frame back to its keyframe (every 10th) was lost, the losses are counted,
  and serving goes on after each restart."""
  device(procs, scene, addr, "--keyint", "10", "--drop-every", "7", "--restart-every", "50")
  cam = camerad(procs, addr)
  ids = served_ids(6)
  lost = lambda f: f % 7 == 6   # encodeId == frame id, both from 0 at each restart
  assert ids and all(not any(lost(d) for d in range(f // 10 * 10, f + 1)) for f in ids), ids
  assert {f for f in range(50) if not any(lost(d) for d in range(f // 10 * 10, f + 1))} - {0} <= set(ids)   # and all those are
  assert any(b < a for a, b in zip(ids, ids[1:])), f"no restart in {ids}"   # served on after a restart
  cam.stop()
  assert re.search(r"skipped \d+: road: frames lost on the way", cam.output()) and "road encoder restarted" in cam.output(), cam.output()

def test_a_device_with_only_a_road_camera_is_served_at_once_and_kept_current(scene, tiny_artifacts, addr, procs):
  """No waiting for cameras that never come, so no backlog: every frame served is at most a few frame periods old
  (the device's EOF to its camera state here; a backlog of the 3 s an earlier camerad waited made it 3 s)."""
  device(procs, scene, addr, "--cameras", "road")
  camerad(procs, addr, "--artifacts", tiny_artifacts)
  assert VisionIpcClient.available_streams("camerad", False) == {ROAD}
  out, (d, n) = Collector(["modelV2"]), start_daemon("modeld", tiny_artifacts)
  try: assert len(out.wait("modelV2", 5, 30)) >= 5
  finally: out.close(); d.stop(); n.close()
  ages = [age for _, age in served(2)]
  assert len(ages) >= 20 and max(ages) < 0.5, ages

def test_a_camera_that_starts_late_joins_and_modeld_takes_it_up(scene, tiny_artifacts, addr, procs):
  """The wide camera starts 3 s after the road one: camerad serves road at once, adds wide at its first frame, and
  modeld, running on road alone meanwhile, reconnects to run road and wide together."""
  device(procs, scene, addr, "--late", "wide=3")
  cam = camerad(procs, addr, "--artifacts", tiny_artifacts)
  assert VisionIpcClient.available_streams("camerad", False) == {ROAD, DRIVER}
  out, (d, n) = Collector(["modelV2"]), start_daemon("modeld", tiny_artifacts)
  try:
    assert len(out.wait("modelV2", 5, 30)) >= 5
    cam.wait_for("the wide camera joined", 10)
    deadline = time.monotonic() + 20
    while f"stream {WIDE_ROAD} " not in d.stderr():
      assert time.monotonic() < deadline, d.stderr()
      time.sleep(0.1)
    out.msgs["modelV2"].clear()
    assert len(out.wait("modelV2", 5, 30)) >= 5
  finally: out.close(); d.stop(); n.close()
  assert VisionIpcClient.available_streams("camerad", False) == {ROAD, WIDE_ROAD, DRIVER}
  assert re.search(rf"connected to 'camerad': stream {ROAD} .*, stream {WIDE_ROAD} ", d.stderr()), d.stderr()

def test_a_camerad_that_fell_behind_skips_to_the_newest_keyframe(scene, addr, procs):
  """camerad stopped for 2 s while the device sends on (a slow machine): the 40 frames a camera queued are not served
  late; camerad starts again at the newest keyframe among them, counts what it skipped, and what it serves after is
  current."""
  device(procs, scene, addr, "--cameras", "road")
  cam = camerad(procs, addr)
  assert served(1)
  cam.proc.send_signal(signal.SIGSTOP)
  time.sleep(2)
  cam.proc.send_signal(signal.SIGCONT)
  got = served(2)
  assert len(got) >= 20 and max(age for _, age in got) < 1, got   # not the 2 s backlog
  assert [i for i, _ in got] == sorted(i for i, _ in got), got
  cam.stop()
  assert re.search(r"skipped \d+: road: frames behind, skipped to the newest keyframe", cam.output()), cam.output()

def test_a_camera_of_a_size_no_artifact_has_is_refused_naming_the_command(tmp_path, tiny_artifacts, addr, procs):
  p = tmp_path / "scene.json"
  p.write_text(json.dumps({"frames": 20, "calib": [0, 0, 0], "intrinsics": {
    "road": {"width": LAYOUT.width, "height": LAYOUT.height, "focal_length": 88.0},
    "driver": {"width": UNSERVED_LAYOUT.width, "height": UNSERVED_LAYOUT.height, "focal_length": 20.0}}}))
  device(procs, p, addr)
  cam = camerad(procs, addr, "--artifacts", tiny_artifacts)
  assert VisionIpcClient.available_streams("camerad", False) == {ROAD}
  cam.wait_for(r"not served: the driver camera is 96x64, .* add a layout of that size: modeld-compile .*--camera 96x64")

def test_a_device_that_goes_quiet_is_reported_once_and_served_again_when_it_is_back(scene, addr, procs):
  dev = device(procs, scene, addr)
  cam = camerad(procs, addr)
  assert served_ids(2)   # from the first keyframe on (one a second)
  dev.stop()
  cam.wait_for("no camera frame for 3 s: waiting for the device", 10)
  time.sleep(1.5)
  device(procs, scene, addr)
  cam.wait_for("frames again", 10)
  assert served_ids(1)
  assert cam.output().count("waiting for the device") == 1 and cam.proc.poll() is None
