"""camerad as a real process: frames through real VisionIPC shared memory, camera states over real pub/sub.

The test process is the consumer a daemon would be: VisionIpcClients read the frames, and in --lockstep it answers
each frame with modelV2 / driverStateV2 carrying the frame id, as modeld and dmonitoringd do."""
import json, os, re, signal, stat, subprocess, sys, time
from pathlib import Path
import av
import numpy as np
import pytest
from cereal import messaging
from cereal.services import CAMERA_STATE_SERVICES
from msgq import runtime_dir
from msgq.visionipc import DRIVER, ROAD, WIDE_ROAD, NV12Layout, VisionIpcClient
from camerad.render import SceneRenderer
from camerad.scene import load_scene
from oproute.logreader import LogReader, segment_dirs
from tests import openpilot_ref
from tests.daemon_harness import Notify

ROOT = Path(__file__).resolve().parents[1]
CAMS = {ROAD: "road", WIDE_ROAD: "wide", DRIVER: "driver"}
# tiny cameras keep rendering cheap; the driver camera has its own size so per-stream layouts are exercised
TINY = {"name": "tiny", "frames": 10, "calib": [0.01, 0.02, -0.015], "lead": {"distance": 30.0},
        "intrinsics": {"road": {"width": 192, "height": 120, "focal_length": 265.0},
                       "wide": {"width": 192, "height": 120, "focal_length": 60.0},
                       "driver": {"width": 160, "height": 96, "focal_length": 60.0}}}

@pytest.fixture(scope="module")
def scene_file(tmp_path_factory) -> Path:
  p = tmp_path_factory.mktemp("scene") / "tiny.json"
  p.write_text(json.dumps(TINY))
  return p

def spawn(module: str, *args: str, env: dict | None = None) -> subprocess.Popen:
  return subprocess.Popen([sys.executable, "-m", module, *map(str, args)], cwd=ROOT, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, env=env)

def finish(p: subprocess.Popen, timeout: float = 20) -> tuple[int, str]:
  try: _, err = p.communicate(timeout=timeout)
  except subprocess.TimeoutExpired:
    p.kill()
    _, err = p.communicate()
    pytest.fail(f"{p.args} did not exit within {timeout} s; stderr:\n{err}")
  return p.returncode, err

def camerad(*args: str, env: dict | None = None) -> subprocess.Popen: return spawn("camerad", *args, env=env)

def wait_for_server(p: subprocess.Popen, name: str = "camerad", timeout: float = 20) -> set[int]:
  deadline = time.monotonic() + timeout
  while not (streams := VisionIpcClient.available_streams(name, block=False)):
    if p.poll() is not None: pytest.fail(f"camerad exited with {p.returncode}: {p.communicate()[1]}")
    if time.monotonic() > deadline: pytest.fail("camerad's VisionIPC server did not come up")
    time.sleep(0.02)
  return streams

def connect(streams) -> dict[int, VisionIpcClient]:
  clients = {s: VisionIpcClient("camerad", s, conflate=False) for s in streams}
  for c in clients.values(): assert c.connect(blocking=False)
  return clients

def lockstep_frames(p: subprocess.Popen, streams: list[int], answer: list[str], on_frame) -> list[int]:
  """Like a daemon: publish the answer services, connect to the streams, subscribe to their camera states (a daemon's
  sign that it is ready), then receive each stream's next frame, check it (on_frame(stream, buf)) and answer with its
  frame id; until camerad exits."""
  pm, ids = messaging.PubMaster(answer), []
  clients = connect(streams)
  sm = messaging.SubMaster([CAMERA_STATE_SERVICES[s] for s in streams])   # without it camerad waits its whole timeout
  try:
    while True:
      bufs = {}
      for s, c in clients.items():
        while (buf := c.recv(200)) is None:
          if p.poll() is not None: return ids
        bufs[s] = buf
      assert len({b.frame_id for b in bufs.values()}) == 1, f"streams disagree on the frame id: {[b.frame_id for b in bufs.values()]}"
      for s, buf in bufs.items():
        on_frame(s, buf)
        assert not buf.overwritten(), f"{CAMS[s]} frame {buf.frame_id} was overwritten while checked (lockstep must prevent it)"
      ids.append(buf.frame_id)
      del buf, bufs
      for svc in answer:
        msg = messaging.new_message(svc)
        getattr(msg, svc).frameId = ids[-1]
        pm.send(svc, msg)
  finally:
    pm.close()
    sm.close()
    for c in clients.values(): c.close()

def planes_equal(buf, ref: np.ndarray) -> bool:
  got = buf.layout.planes(np.frombuffer(buf.data, np.uint8).copy())
  return all(np.array_equal(a, b) for a, b in zip(got, buf.layout.planes(ref)))

def test_help_explains_every_option():
  out = subprocess.run([sys.executable, "-m", "camerad", "--help"], cwd=ROOT, capture_output=True, text=True, timeout=30)
  assert out.returncode == 0
  for opt in ("--source", "--name", "--cameras", "--services", "--fps", "--lockstep", "--lockstep-services", "--lockstep-timeout",
              "--loop", "--start", "--frames", "--layout", "--buffers", "synthetic:SCENE", "[CAM=]FILE", "/dev/videoN", "LOG"):
    assert opt in out.stdout, opt

def test_synthetic_lockstep_pixel_exact_with_states(scene_file):
  """Every frame of every stream, in order, equals SceneRenderer's output for that frame in the aligned layout; the
  camera states carry the same frame id and timestamps, which advance by the scene's frame period (lockstep frames
  carry source time, whatever the answers' pace); calibration and carState come from the scene."""
  scene = load_scene(scene_file)
  p = camerad("--source", f"synthetic:{scene_file}", "--lockstep", "--layout", "aligned", "--lockstep-timeout", "10")
  try:
    assert wait_for_server(p) == {ROAD, WIDE_ROAD, DRIVER}
    # subscribe before the clients connect: lockstep starts sending once every stream has a client
    states = {s: messaging.sub_sock(svc, timeout=2000) for s, svc in CAMERA_STATE_SERVICES.items()}
    cal, car = messaging.sub_sock("liveCalibration", timeout=2000), messaging.sub_sock("carState", timeout=2000)
    refs, sofs = {}, {}
    def check(s, buf):
      cam = scene.cameras[CAMS[s]]
      assert buf.layout == NV12Layout.aligned(cam.width, cam.height) and buf.stride % 128 == 0
      if s not in refs: refs[s] = SceneRenderer(scene, CAMS[s], buf.layout)
      assert planes_equal(buf, refs[s].render(buf.frame_id)), f"{CAMS[s]} frame {buf.frame_id} differs from the renderer"
      st = getattr(messaging.recv_one(states[s]), CAMERA_STATE_SERVICES[s])
      assert (st.frameId, st.timestampSof, st.timestampEof) == (buf.frame_id, buf.timestamp_sof, buf.timestamp_eof)
      sof0 = sofs.setdefault(s, st.timestampSof - st.frameId * 50_000_000)
      assert st.timestampSof == sof0 + st.frameId * 50_000_000 and st.timestampSof <= st.timestampEof and st.frameIdSensor == st.frameId
      assert str(st.sensor) == "ar0231"
    ids = lockstep_frames(p, [ROAD, WIDE_ROAD, DRIVER], ["modelV2", "driverStateV2"], check)
    assert ids == list(range(scene.n_frames))
    rc, err = finish(p)
    assert rc == 0, err
    c = messaging.recv_one(cal).liveCalibration
    assert str(c.calStatus) == "calibrated" and np.allclose(list(c.rpyCalib), scene.calib, atol=1e-7)
    cars = messaging.drain_sock(car)
    assert [round(m.carState.vEgo, 3) for m in cars] == [round(scene.truth(i)["v_ego"], 3) for i in range(scene.n_frames)]
  finally:
    if p.poll() is None: p.kill()

def test_real_time_explicit_layout_and_frames(scene_file):
  """Paced by --fps, one camera, a padded layout given as WxH:stride:uv_offset:size; --start, --loop (each pass starts
  over at --start, frame ids keep increasing), --frames N then exit 0."""
  scene, layout = load_scene(scene_file), NV12Layout(192, 120, 256, 256 * 128, 256 * 128 + 256 * 64)
  p = camerad("--source", f"synthetic:{scene_file}", "--cameras", "road", "--fps", "20", "--start", "3", "--frames", "16", "--loop",
              "--layout", str(layout))
  try:
    assert wait_for_server(p) == {ROAD}
    (client,) = connect([ROAD]).values()
    assert client.layout == layout
    r, got, t = SceneRenderer(scene, "road", layout), [], []
    while (buf := client.recv(2000)) is not None:
      assert planes_equal(buf, r.render(3 + (buf.frame_id - 3) % (scene.n_frames - 3))) and not buf.overwritten()
      got.append(buf.frame_id)
      t.append(buf.timestamp_sof)
      del buf
    rc, err = finish(p)
    assert rc == 0, err
    assert got and got == list(range(got[0], 3 + 16)) and len(got) >= 8, got
    assert all(np.diff(t) > 0)
  finally:
    if p.poll() is None: p.kill()

def test_lockstep_without_daemon_is_a_clear_error(scene_file):
  p = camerad("--source", f"synthetic:{scene_file}", "--cameras", "road", "--lockstep", "--lockstep-timeout", "1")
  rc, err = finish(p)
  assert rc == 1 and "no VisionIPC client for road within 1 s" in err, err
  p = camerad("--source", f"synthetic:{scene_file}", "--cameras", "road", "--lockstep", "--lockstep-timeout", "1")
  try:
    wait_for_server(p)
    (client,) = connect([ROAD]).values()   # a client, but nobody answers
    rc, err = finish(p)
    assert rc == 1 and "no modelV2 for frame 0 within 1 s" in err, err
    client.close()
  finally:
    if p.poll() is None: p.kill()

def test_lockstep_skips_what_is_not_its_answer(scene_file):
  """On the answer topic, before each real answer: a well-formed Event of another service (carState) and bytes that are
  no Event. camerad skips both, says so (once: its warnings are rate-limited), and serves every frame; reading the
  first as a modelV2 once crashed it."""
  p = camerad("--source", f"synthetic:{scene_file}", "--cameras", "road", "--lockstep", "--lockstep-timeout", "10")
  pm = messaging.PubMaster(["modelV2"])
  try:
    wait_for_server(p)
    (client,) = connect([ROAD]).values()
    sm, ids = messaging.SubMaster(["roadCameraState"]), []   # ready, as a daemon says it: camerad need not wait its timeout
    while p.poll() is None:
      if (buf := client.recv(200)) is None: continue
      ids.append(buf.frame_id)
      del buf
      wrong = messaging.new_message("carState")
      wrong.carState.vEgo = 1.0
      pm.send("modelV2", wrong)
      pm.send("modelV2", b"\xff" * 16)
      answer = messaging.new_message("modelV2")
      answer.modelV2.frameId = ids[-1]
      pm.send("modelV2", answer)
    client.close()
    sm.close()
    rc, err = finish(p)
    assert rc == 0 and ids == list(range(TINY["frames"])) and "Traceback" not in err, (ids, err)
    assert "lockstep: malformed modelV2 ignored: expected a modelV2 message, got carState" in err, err   # the rest rate-limited
  finally:
    pm.close()
    if p.poll() is None: p.kill()

@pytest.mark.parametrize("recorder", [False, True], ids=["alone", "beside-a-recorder"])
def test_lockstep_waits_for_a_daemon_that_subscribes_after_its_warm_up(scene_file, recorder):
  """A daemon connects its camera clients, then warms its models up and only then subscribes (a reader means ready, as
  openpilot's modeld): camerad sends frame 0 only once the camera's state has that reader, however long the warm-up
  (here 3 s, over the 2 s camerad gives readers of its other messages), so frame 0's state reaches the daemon. Also
  when another process (a recorder) read the camera's state first: its reader is not the daemon's."""
  rec = subprocess.Popen([sys.executable, "-c", "from cereal import messaging; import sys, time; s = messaging.sub_sock('roadCameraState'); "
                          "print('subscribed', flush=True); time.sleep(60)"], cwd=ROOT, stdout=subprocess.PIPE, text=True) if recorder else None
  p = camerad("--source", f"synthetic:{scene_file}", "--cameras", "road", "--lockstep", "--lockstep-timeout", "10")
  try:
    if rec is not None: assert rec.stdout.readline() == "subscribed\n"
    wait_for_server(p)
    (client,) = connect([ROAD]).values()
    time.sleep(3)   # the warm-up
    sock = messaging.sub_sock("roadCameraState", timeout=5000)
    while (buf := client.recv(200)) is None: assert p.poll() is None, p.communicate()[1]
    frame_id, state = buf.frame_id, messaging.recv_one(sock)
    del buf
    assert frame_id == 0 and state is not None and state.roadCameraState.frameId == 0, (frame_id, state)
    client.close(); sock.close()
  finally:
    if p.poll() is None: p.kill(); p.communicate()
    if rec is not None: rec.kill(); rec.wait()

BAD_OPTIONS = [   # (options after --source synthetic:SCENE unless they give their own --source, what stderr says)
  (["--fps", "0"], "--fps: expected 0 < F <= 1000, got 0.0"),
  (["--frames", "-1"], "--frames: expected >= 1, got -1"),
  (["--start", "-1"], "--start: expected >= 0, got -1"),
  (["--lockstep", "--lockstep-timeout", "0"], "--lockstep-timeout: expected > 0, got 0.0"),
  (["--buffers", "0"], "--buffers: expected 1 <= N <= 127, got 0"),
  (["--buffers", "128"], "--buffers: expected 1 <= N <= 127, got 128"),   # openpilot's client takes fewer than 128 fds
  (["--log-level", "loud"], "invalid choice: 'LOUD'"),
  (["--layout", "100x50"], "--layout 100x50:100:5000:7500: no stream of that size (streams: road 192x120, wide 192x120, driver 160x96)"),
  (["--layout", "100x100:aligned"], "--layout 100x100:128:16384:24576: no stream of that size"),
  (["--layout", "wide"], "camera layout 'wide': expected 'WxH', 'WxH:aligned' or 'WxH:stride:uv_offset:size'"),
  (["--cameras", "road,rear"], "--cameras: expected road, wide, driver; got ['rear']"),
  (["--services", "noSuchService"], "--services: expected services of cereal/log.capnp's Event"),
  (["--services", "carState"], "--services and --messages-only apply to a LOG source, not to a synthetic scene"),
  (["--lockstep-services", "modelV2"], "--lockstep-services: applies to --lockstep only"),
  (["--lockstep-timeout", "5"], "--lockstep-timeout: applies to --lockstep only"),
  (["--lockstep", "--lockstep-services", "noSuchService"], "--lockstep-services: unknown services ['noSuchService']"),
  (["--source", "synthetic:no_such_scene"], "no shipped scene 'no_such_scene' (shipped: curve, driver_blinking, driver_distracted, "
                                            "lane_change, lead_braking, straight; or give a scene file)"),
  (["--source", "front=drive.mp4"], "--source 'front=drive.mp4': unknown camera 'front'; expected road, driver, wide (CAM=FILE)"),
  (["--source", "a.mp4", "b.mp4"], "--source 'b.mp4': with several files, name each one's camera"),
  (["--source", "road=a.mp4", "road=b.mp4"], "--source 'road=b.mp4': camera road given twice"),
  (["--source", "road=a.mp4", "--cameras", "road"], "--cameras applies to a synthetic scene"),
  (["--source", "road=a.mp4", "--messages-only"], "--services and --messages-only apply to a LOG source, not to video files or devices"),
  (["--source", "synthetic:straight", "synthetic:curve"], "a synthetic source serves every camera of its scene; got more sources"),
]

def test_every_bad_option_exits_2(scene_file):
  """Each bad option exits 2 (docs/CAMERAD.md), found by argparse or once the source is known, with a message naming
  the option, what it expects and what it got; a source that cannot be served exits 1."""
  procs = [(camerad(*(opts if "--source" in opts else ["--source", f"synthetic:{scene_file}", *opts])), opts, msg) for opts, msg in BAD_OPTIONS]
  for p, opts, msg in procs:
    rc, err = finish(p)
    assert rc == 2 and msg in err and "Traceback" not in err, (opts, rc, err)
  rc, err = finish(camerad("--source", f"synthetic:{scene_file}", "--start", "10"))
  assert rc == 1 and "the source gave no frame from --start 10 on" in err, err
  rc, err = finish(camerad("--source", "synthetic:missing.json"))
  assert rc == 1 and "synthetic scene 'missing.json': no such file (or give a shipped scene: curve, driver_blinking," in err, err

def _sockets() -> set[str]:
  d = runtime_dir()
  return {f for f in os.listdir(d) if stat.S_ISSOCK(os.lstat(os.path.join(d, f)).st_mode)}

@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_exits_clean(scene_file, sig):
  p = camerad("--source", f"synthetic:{scene_file}", "--loop")
  try:
    wait_for_server(p)
    (client,) = connect([DRIVER]).values()
    assert client.recv(5000) is not None
    assert _sockets(), "camerad's sockets should exist while it runs"
    p.send_signal(sig)
    rc, err = finish(p, 10)
    assert rc == 0, err
    client.close()
    assert _sockets() == set(), f"left behind: {_sockets()}"
    # VisionIPC buffers are memfds: nothing of camerad's may appear in /dev/shm (others' files come and go there)
    assert [f for f in os.listdir("/dev/shm") if os.environ["OPENPILOT_PREFIX"] in f] == []
  finally:
    if p.poll() is None: p.kill()

# ---- video files
def make_video(path: Path, codec: str, n: int = 12, w: int = 160, h: int = 96, fmt: str | None = None, phase: int = 0,
               pix_fmt: str = "yuv420p", rate: int = 20) -> Path:
  c = av.open(str(path), "w", format=fmt)
  st = c.add_stream(codec, rate=rate)
  st.width, st.height, st.pix_fmt = w, h, pix_fmt
  if codec == "libx264": st.codec_context.options = {"x264-params": "cpu-independent=1"}   # the same bytes on every CPU
  if codec == "libx265": st.codec_context.options = {"preset": "ultrafast", "tune": "zerolatency", "x265-params": "log-level=error"}
  x = np.arange(w)[None, :] + 2 * np.arange(h)[:, None]
  for i in range(n):
    img = np.stack([(3 * x + 10 * i + phase) % 256, (x + 40 * i) % 256, (2 * x + phase) % 256], -1).astype(np.uint8)
    for pk in st.encode(av.VideoFrame.from_ndarray(img, format="rgb24")): c.mux(pk)
  for pk in st.encode(): c.mux(pk)
  c.close()
  return path

def reference_nv12(path: Path) -> list[np.ndarray]:
  with av.open(str(path)) as c: return [f.to_ndarray(format="nv12") for f in c.decode(video=0)]

def _has_encoder(name: str) -> bool:
  try: av.codec.Codec(name, "w")
  except Exception: return False
  return True

@pytest.mark.parametrize("wide", ["hevc", "ts", "422"])
def test_video_files_decoded_into_buffers(tmp_path, wide):
  """An H.264 mp4 on road and a raw .hevc (or an MPEG-TS, or a 4:2:2 FFV1 mkv that goes through PyAV's reformat) on
  wide, decoded into aligned buffers: each frame equals PyAV's own NV12 conversion of the same decode, byte for byte."""
  if wide == "hevc" and not _has_encoder("libx265"): pytest.skip("this FFmpeg has no HEVC encoder (libx265) to make the file")
  road = make_video(tmp_path / "road.mp4", "libx264", n=12)
  wide_file = {"hevc": lambda: make_video(tmp_path / "wide.hevc", "libx265", n=10, fmt="hevc", phase=50),
               "ts": lambda: make_video(tmp_path / "wide.ts", "libx264", n=10, fmt="mpegts", phase=50),
               "422": lambda: make_video(tmp_path / "wide.mkv", "ffv1", n=10, phase=50, pix_fmt="yuv422p")}[wide]()
  refs = {ROAD: reference_nv12(road), WIDE_ROAD: reference_nv12(wide_file)}
  p = camerad("--source", f"road={road}", "--source", f"wide={wide_file}", "--lockstep", "--layout", "aligned")
  try:
    assert wait_for_server(p) == {ROAD, WIDE_ROAD}
    def check(s, buf):
      ref = refs[s][buf.frame_id]
      a = np.frombuffer(buf.data, np.uint8)
      y = a[:buf.stride * 96].reshape(96, buf.stride)[:, :160]
      uv = a[buf.uv_offset:buf.uv_offset + buf.stride * 48].reshape(48, buf.stride)[:, :160]
      assert np.array_equal(np.concatenate([y, uv]), ref), f"{CAMS[s]} frame {buf.frame_id}"
    ids = lockstep_frames(p, [ROAD, WIDE_ROAD], ["modelV2"], check)
    rc, err = finish(p)
    assert rc == 0 and ids == list(range(10)), f"{ids}\n{err}"   # the shorter file ends the source
  finally:
    if p.poll() is None: p.kill()

def test_video_rate_of_its_container_or_the_cameras(tmp_path):
  """A video file is served at its container's rate; a raw HEVC or H.264 stream has none (FFmpeg's demuxer reports 25,
  whatever it holds), so it is served at the cameras' rate, as openpilot's fcamera.hevc was recorded."""
  from camerad.sources import open_source
  from oproute.video import DEFAULT_FPS
  if not _has_encoder("libx265"): pytest.skip("this FFmpeg has no HEVC encoder (libx265) to make the file")
  for name, codec, fmt, want in (("f.hevc", "libx265", "hevc", DEFAULT_FPS), ("f.h264", "libx264", "h264", DEFAULT_FPS),
                                 ("f.mp4", "libx264", None, 10), ("f.ts", "libx264", "mpegts", 10)):
    src = open_source([f"road={make_video(tmp_path / name, codec, n=3, fmt=fmt, rate=10)}"])
    try: assert src.fps == want, f"{name}: served at {src.fps} frames/s, expected {want}"
    finally: src.close()

def test_bad_video_files(tmp_path):
  """Undecodable or missing files are a clear error (exit 1), a file cut short serves what it holds (exit 0), a damaged
  stream serves what decodes and counts what it skipped (exit 0), never a hang."""
  good = make_video(tmp_path / "good.ts", "libx264", n=12, fmt="mpegts")
  mp4 = make_video(tmp_path / "good.mp4", "libx264", n=12)
  raw = make_video(tmp_path / "good.h264", "libx264", n=12, fmt="h264")
  (tmp_path / "garbage.mp4").write_bytes(np.random.default_rng(0).bytes(5000))
  (tmp_path / "cut.mp4").write_bytes(mp4.read_bytes()[:mp4.stat().st_size // 2])   # its index (moov) is at the end: gone
  (tmp_path / "cut.ts").write_bytes(good.read_bytes()[:good.stat().st_size // 2])
  d = bytearray(raw.read_bytes())
  d[len(d) // 4::53] = b"\x00" * len(d[len(d) // 4::53])   # zeros sprinkled over 3/4 of the stream
  (tmp_path / "damaged.h264").write_bytes(bytes(d))
  (tmp_path / "empty.mkv").write_bytes(b"")
  cases = {"garbage.mp4": (1, "cannot open as video"), "cut.mp4": (1, "cannot open as video"), "empty.mkv": (1, "cannot open as video"),
           "missing.mp4": (1, "no such file"), "cut.ts": (0, "served"), "damaged.h264": (None, None)}
  # in parallel, each on its own prefix (one publisher per endpoint and prefix)
  procs = {f: camerad("--source", tmp_path / f, "--fps", "200", env={**os.environ, "OPENPILOT_PREFIX": f"{os.environ['OPENPILOT_PREFIX']}{i}"})
           for i, f in enumerate(cases)}
  for f, (code, text) in cases.items():
    rc, err = finish(procs[f], 30)
    if code is None:   # damaged: what decodes is served, each packet that does not is skipped and counted
      m = re.search(r"served (\d+) frames.*, skipped (\d+)", err)
      assert rc == 0 and m, f"{f}: rc {rc}\n{err}"
      assert int(m[1]) >= 1 and int(m[2]) >= 1 and int(m[1]) + int(m[2]) <= 12, err
      assert "undecodable packet" in err, "the skip is named"
    else:
      assert rc == code and text in err, f"{f}: rc {rc}\n{err}"
      if rc == 1: assert str(tmp_path / f) in err, "the error names the file"

def _open_fds(path: Path) -> int:
  return sum(os.path.realpath(f"/proc/self/fd/{fd}") == str(path.resolve()) for fd in os.listdir("/proc/self/fd"))

def test_files_opened_before_a_bad_one_are_closed(tmp_path):
  """A source whose second file cannot be opened closes the first one's decoder before the error goes up (the
  error's traceback keeps the decoders' frame alive: nothing else would close them)."""
  from camerad.sources import VideoSource
  from oproute.video import VideoError
  good = make_video(tmp_path / "good.mp4", "libx264", n=2)
  (tmp_path / "garbage.mp4").write_bytes(np.random.default_rng(0).bytes(5000))
  with pytest.raises(VideoError, match="garbage.mp4: cannot open as video") as e:
    VideoSource({ROAD: str(good), WIDE_ROAD: str(tmp_path / "garbage.mp4")})
  assert _open_fds(good) == 0, f"{good} is still open after {e.value}"
  src = VideoSource({ROAD: str(good)})   # the check can fail: an open decoder shows
  assert _open_fds(good) == 1
  src.close()
  assert _open_fds(good) == 0

def test_v4l2_device():
  devices = sorted(str(p) for p in Path("/dev").glob("video*"))
  if not devices: pytest.skip("no V4L2 device (/dev/video*) on this machine")
  notify = Notify()
  p = camerad("--source", devices[0], "--frames", "3", env={**os.environ, "NOTIFY_SOCKET": notify.addr})
  try:
    wait_for_server(p)
    (client,) = connect([ROAD]).values()
    rc, err = finish(p, 30)
    notify.wait("STATUS=stopped", 5)
    assert rc == 0 and notify.count("frames") == 3, f"{notify.messages}\n{err}"
    client.close()
  finally:
    if p.poll() is None: p.kill()
    notify.close()

# ---- recorded logs
def test_log_replay_with_video(scene_file, tmp_path):
  """Record a lockstep synthetic run (messages + lossless road and driver video, several segments): openpilot's own
  LogReader reads every log of it, message for message. Then serve the route in lockstep: every frame pixel-exact to
  the scene, both streams of a frame together, the recorded messages (wide road camera states, whose video was not
  recorded, and carState) republished byte for byte."""
  scene, route = load_scene(scene_file), tmp_path / "route"
  services = ["carState", "liveCalibration", "roadCameraState", "wideRoadCameraState", "driverCameraState"]
  # camerad first: it publishes nothing until every stream has a client, so the recorder (started next, subscribing
  # to running publishers) and its video clients get everything from frame 0; this test answers like the daemons
  cam = camerad("--source", f"synthetic:{scene_file}", "--lockstep")
  rec, notify = None, Notify()
  try:
    wait_for_server(cam)
    pm, states = messaging.PubMaster(["modelV2", "driverStateV2"]), {s: messaging.sub_sock(s, timeout=200) for s in ("roadCameraState", "driverCameraState")}
    (wide,) = connect([WIDE_ROAD]).values()   # the wide stream is served but not recorded as video
    rec = spawn("modeld_tools.record", "--route", route, "--segment-seconds", "0.2", "--video", "road,driver", "--lossless", "--stats-interval", "0",
                *services, env={**os.environ, "NOTIFY_SOCKET": notify.addr})
    while cam.poll() is None:
      for svc, answer in (("roadCameraState", "modelV2"), ("driverCameraState", "driverStateV2")):
        if (ev := messaging.recv_one(states[svc])) is not None:
          time.sleep(0.03)   # the run spans several segments
          msg = messaging.new_message(answer)
          getattr(msg, answer).frameId = getattr(ev, svc).frameId
          pm.send(answer, msg)
    rc, err = finish(cam)
    assert rc == 0, err
    wide.close()
    pm.close()
    for svc in ("roadCameraState", "driverCameraState", "wideRoadCameraState", "roadEncodeIdx", "driverEncodeIdx"):
      notify.wait_count(svc, scene.n_frames)   # recorded: a stop now loses nothing
    rec.send_signal(signal.SIGTERM)
    rc, err = finish(rec)
    assert rc == 0, err
  finally:
    for p in (cam, rec):
      if p is not None and p.poll() is None: p.kill()
    notify.close()
  segs = segment_dirs(route)
  assert len(segs) >= 2
  recorded = {}
  for dat, ev in LogReader(route, sort_by_time=True).raw(): recorded.setdefault(ev.which(), []).append((dat, ev))
  for svc in ("roadCameraState", "driverCameraState", "wideRoadCameraState", "roadEncodeIdx", "driverEncodeIdx"):
    assert [getattr(ev, svc).frameId for _, ev in recorded[svc]] == list(range(scene.n_frames)), svc
  for svc, video in (("roadEncodeIdx", "fcamera.hevc"), ("driverEncodeIdx", "dcamera.hevc")):   # each frame where its index says
    for seg in segs:
      idx = [getattr(ev, svc) for _, ev in recorded[svc] if getattr(ev, svc).segmentNum == int(seg.name.rsplit("--", 1)[1])]
      assert [e.segmentId for e in idx] == list(range(len(idx))) and all(e.type == "fullHEVC" for e in idx), (svc, seg.name)
      if not idx: assert not (seg / video).exists()   # a segment the run ended in before a frame came
      else: assert len(list(av.open(str(seg / video)).decode(video=0))) == len(idx) and idx[0].flags & 8, (svc, seg.name)
  logs = [seg / log for seg in segs for log in ("rlog.zst", "qlog.zst")]
  theirs = openpilot_ref.logreader_events(logs, tmp_path)
  for log, events in zip(logs, theirs):
    ours = list(LogReader(log).raw())
    assert [(w, t, b) for w, t, b in events] == [(ev.which(), ev.logMonoTime, openpilot_ref.canonical(dat)) for dat, ev in ours], log
    assert events[0][0] == "initData", log
  assert sum(map(len, theirs)) > 4 * scene.n_frames, "openpilot's LogReader read the recorded frames' events"

  p = camerad("--source", route, "--lockstep")
  try:
    assert wait_for_server(p) == {ROAD, DRIVER}
    subs = {svc: messaging.sub_sock(svc) for svc in ("carState", "wideRoadCameraState")}
    refs = {s: SceneRenderer(scene, CAMS[s], NV12Layout.packed(*(lambda c: (c.width, c.height))(scene.cameras[CAMS[s]]))) for s in (ROAD, DRIVER)}
    replayed = {svc: [] for svc in subs}
    def check(s, buf):
      for svc, sock in subs.items(): replayed[svc] += messaging.drain_sock_raw(sock)
      assert planes_equal(buf, refs[s].render(buf.frame_id)), f"{CAMS[s]} frame {buf.frame_id}"
    ids = lockstep_frames(p, [ROAD, DRIVER], ["modelV2", "driverStateV2"], check)
    rc, err = finish(p)
    assert rc == 0 and ids == list(range(scene.n_frames)), f"{ids}\n{err}"
    for svc, sock in subs.items():
      replayed[svc] += messaging.drain_sock_raw(sock)
      assert replayed[svc] == [dat for dat, _ in recorded[svc]], f"{svc} is replayed byte for byte"
  finally:
    if p.poll() is None: p.kill()

def test_log_replay_messages_only(tmp_path):
  """A route without video, replayed with --messages-only: camera states and the rest are republished as recorded,
  byte for byte, at their pace."""
  from oproute.writer import LogFile
  seg = tmp_path / "r" / "r--0"
  seg.mkdir(parents=True)
  t0, recorded = time.monotonic_ns(), []
  for i in range(20):
    for svc in ("roadCameraState", "carState"):
      msg = messaging.new_message(svc, logMonoTime=t0 + i * 100_000_000)
      if svc == "roadCameraState": msg.roadCameraState.frameId = i
      else: msg.carState.vEgo = i
      recorded.append((svc, msg.to_bytes()))
  w = LogFile(seg / "rlog.zst")
  for _, dat in recorded: w.write(dat)
  w.close()
  socks = {svc: messaging.sub_sock(svc) for svc in ("roadCameraState", "carState")}
  t = time.monotonic()
  rc, err = finish(camerad("--source", tmp_path / "r", "--messages-only"))
  assert rc == 0 and "messages only" in err, err
  assert time.monotonic() - t > 1.9, "replayed at the recorded pace (2 s)"
  for svc, sock in socks.items():
    got, sent = messaging.drain_sock_raw(sock), [d for s, d in recorded if s == svc]
    # the subscription connects while camerad starts up; from then on nothing is lost or changed
    assert len(got) >= 10 and got == sent[len(sent) - len(got):], svc

def test_log_replay_republishes_services_outside_the_table(tmp_path):
  """An openpilot route's controlsState and liveParameters (openpilot's schema; not in the project's services table)
  are republished byte for byte, as carState is; initData, the cameras' EncodeIdx events and the daemons' outputs
  (cameraOdometry here) are not."""
  from tests import openpilot_ref as op
  from tests.artifacts import LAYOUT
  from tests.openpilot_route import write_route
  scene = tmp_path / "scene.json"
  scene.write_text(json.dumps({"frames": 5, "intrinsics": {c: {"width": LAYOUT.width, "height": LAYOUT.height, "focal_length": 88.0}
                                                            for c in ("road", "wide", "driver")}}))
  def extra(fid: int, t: int) -> list:
    cs = op.log.Event.new_message(logMonoTime=t, valid=True)
    cs.init("controlsState").longitudinalPlanMonoTime = fid
    lp = op.log.Event.new_message(logMonoTime=t + 1, valid=True)
    lp.init("liveParameters").stiffnessFactor = fid / 1000
    co = op.log.Event.new_message(logMonoTime=t + 2, valid=True)
    co.init("cameraOdometry").frameId = fid
    return [cs, lp, co]
  write_route(tmp_path / "route", scene, ("road",), segments=1, frames=5, extra=extra)
  recorded = {}
  for dat, ev in LogReader(tmp_path / "route", sort_by_time=True).raw(): recorded.setdefault(ev.which(), []).append(dat)
  p = camerad("--source", tmp_path / "route", "--lockstep")
  try:
    wait_for_server(p)   # its publishers are up: these subscriptions are live, and lockstep waits for them before frame 1
    subs = {svc: messaging.sub_sock(svc) for svc in ("controlsState", "liveParameters", "carState", "initData", "roadEncodeIdx", "cameraOdometry")}
    got = {svc: [] for svc in subs}
    def drain(*_):
      for svc, sock in subs.items(): got[svc] += messaging.drain_sock_raw(sock)
    assert lockstep_frames(p, [ROAD], ["modelV2"], drain) == list(range(100, 105))
    rc, err = finish(p)
    assert rc == 0, err
    drain()
  finally:
    if p.poll() is None: p.kill()
  for svc in ("controlsState", "liveParameters", "carState"):
    assert len(recorded[svc]) == 5 and got[svc] == recorded[svc], f"{svc}: {len(got[svc])} of {len(recorded[svc])} republished as recorded"
  for svc in ("initData", "roadEncodeIdx", "cameraOdometry"): assert recorded[svc] and got[svc] == [], svc

def test_lockstep_with_the_real_daemons(tmp_path):
  """camerad --lockstep against modeld and dmonitoringd (tiny models): every frame is served and answered once, by
  both daemons, none is dropped."""
  from tests.artifacts import CACHE, LAYOUT, build
  from tests.daemon_harness import Collector, Daemon
  art = build(CACHE.parent / "tiny", models="tiny")
  scene = tmp_path / "scene.json"
  scene.write_text(json.dumps({"frames": 20, "calib": [0.01, 0.02, -0.015], "intrinsics": {
    c: {"width": LAYOUT.width, "height": LAYOUT.height, "focal_length": f} for c, f in (("road", 88.0), ("wide", 20.0), ("driver", 20.0))}}))
  notify = {name: Notify() for name in ("camerad", "modeld", "dmonitoringd")}
  daemons = {m: Daemon(m, art, "--stats-interval", "0", notify=notify[m]) for m in ("modeld", "dmonitoringd")}
  col = Collector(["modelV2", "driverStateV2"])
  try:
    p = camerad("--source", f"synthetic:{scene}", "--lockstep", "--lockstep-timeout", "60", env={**os.environ, "NOTIFY_SOCKET": notify["camerad"].addr})
    while p.poll() is None:
      col.poll()
      time.sleep(0.01)
    rc, err = finish(p)
    notify["camerad"].wait("STATUS=stopped", 5)
    assert rc == 0 and notify["camerad"].count("frames") == 20, f"{notify['camerad'].messages}\n{err}"
    for svc in ("modelV2", "driverStateV2"):
      assert [getattr(ev, svc).frameId for ev in col.wait(svc, 20)] == list(range(20)), svc
    for m, d in daemons.items():
      notify[m].wait_count("frames", 20)
      assert d.stop()[0] == 0 and notify[m].count("frames") == 20, d.stderr()
  finally:
    for d in daemons.values(): d.stop()
    col.close()
    for n in notify.values(): n.close()

def test_real_time_pacing_skips_what_it_is_late_for_and_never_builds_a_backlog(tmp_path):
  """camerad stopped for 1.5 s (a slow machine) while serving a scene in real time: after it, the frames it is late
  for are skipped and counted, not served late, so the frame served is again the one real time is at (a pacing that
  started counting from the resume would stay 30 frames behind for good)."""
  (scene := tmp_path / "long.json").write_text(json.dumps({**TINY, "frames": 100}))   # 5 s: no loop, frame id = scene frame
  p = camerad("--source", f"synthetic:{scene}", "--cameras", "road")
  sock = messaging.sub_sock("roadCameraState", timeout=100)
  try:
    wait_for_server(p)
    got = []   # (frame id, arrival s)
    def collect(seconds: float) -> None:
      deadline = time.monotonic() + seconds
      while time.monotonic() < deadline:
        if (dat := sock.receive()) is not None: got.append((messaging.log_from_bytes(dat).roadCameraState.frameId, time.monotonic()))
    collect(1)
    p.send_signal(signal.SIGSTOP)
    time.sleep(1.5)
    p.send_signal(signal.SIGCONT)
    collect(1.5)
    p.send_signal(signal.SIGTERM)
    rc, err = finish(p)
  finally:
    if p.poll() is None: p.kill()
    sock.close()
  assert rc == 0, err
  (i0, t0), (i1, t1) = got[0], got[-1]
  assert abs((i1 - i0) - (t1 - t0) * 20) <= 4, (got[0], got[-1])   # on schedule at the end, not 30 frames behind
  assert re.search(r"skipped \d+: road: late, not served \(over 100 ms behind real time\)", err), err
