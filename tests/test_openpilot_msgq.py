"""The shm transport against openpilot's own msgq and VisionIPC (commaai/msgq from OPENPILOT_MSGQ_SRC: tests/upstream.py), real
processes on both sides: messages, the newest-publisher rule, Poller wake-ups, openpilot's Python tests on the project's
msgq, modeld on openpilot's camera, camerad feeding openpilot's VisionIpcClient. openpilot's side runs the upstream_*
functions in child processes (Upstream), with openpilot's schema. Without OPENPILOT_MSGQ_SRC every test skips.
"""
import hashlib, os, random, statistics, subprocess, sys, time
import pytest
import msgq
from cereal.services import SERVICES
from camerad.render import SceneRenderer
from camerad.scene import load_scene
from tests.artifacts import LAYOUT, REPO
from tests.daemon_harness import start_daemon
from tests.upstream import Upstream, built, listen, run_openpilot_tests, source, source_files, tell

# 4 B to 300 KB (a third of the 1 MiB segment of an endpoint outside the services table takes 349,512), in three rounds:
# the ring wraps several times, at different offsets
SIZES = [4, 5, 8, 13, 100, 1000, 4096, 65_536, 7, 100_003, 3, 200_000, 9, 300_000] * 3
BIG = 65_536            # the sender waits for the reader to catch up after a message this large: a lapped reader skips to the newest
WAKEUPS, PERIOD = 100, 0.01
OPENPILOT_TESTS = ('msgq/tests/test_messaging.py', 'msgq/tests/test_poller.py', 'msgq/visionipc/tests/test_visionipc.py')

@pytest.fixture(scope='module')
def upstream():
  """openpilot's msgq built (once per source), or every test using it skipped."""
  return built()

@pytest.fixture(autouse=True)
def shm(monkeypatch):
  """The project's side on openpilot's transport; the daemons started here inherit it."""
  monkeypatch.setenv('MSGQ_TRANSPORT', 'shm')

def payload(i: int, n: int) -> bytes: return random.Random(i).randbytes(n)   # the children make the same (one interpreter)
def digest(m: bytes) -> list: return [len(m), hashlib.sha256(m).hexdigest()]

def percentiles(ms: list[float]) -> dict[str, float]:
  return {'p50': statistics.median(ms), 'p90': statistics.quantiles(ms, n=10)[8], 'max': max(ms)}
def show(p: dict[str, float]) -> str: return ' '.join(f'{k} {v:.3f}' for k, v in p.items())

# ***** openpilot's side (run in child processes: each imports what it uses) *****

def upstream_subscriber(endpoint: str, count: int) -> None:
  """openpilot's SubSocket: the length and sha256 of `count` messages."""
  import hashlib, msgq
  sub = msgq.sub_sock(endpoint, timeout=10_000)
  tell('subscribed')
  got = []
  while len(got) < count and (m := sub.receive()) is not None: got.append([len(m), hashlib.sha256(m).hexdigest()])
  tell(got)

def upstream_publisher(endpoint: str, sizes: list[int], big: int) -> None:
  """openpilot's PubSocket: once told, message i of sizes[i] random bytes (seeded by i), each big one only after the readers read it."""
  import msgq, random
  pub = msgq.pub_sock(endpoint)
  tell('publishing')
  listen()
  for i, n in enumerate(sizes):
    pub.send(random.Random(i).randbytes(n))
    if n >= big: pub.wait_for_readers(5)
  tell('sent')

def upstream_newer_publisher(endpoint: str) -> None:
  """openpilot's PubSocket, the newest on its endpoint: sends each word it is told, says 'sent' or the exception's name."""
  import msgq
  pub = msgq.pub_sock(endpoint)
  tell('publishing')
  while (word := listen()) is not None:
    try: pub.send(word.encode()); tell('sent')
    except msgq.IpcError as e: tell(type(e).__name__)

def upstream_poller(endpoint: str, count: int) -> None:
  """openpilot's Poller, blocked in poll(10 s) until a message comes: [[message id, send ns, wake-up ns]] for `count` messages."""
  import msgq, time
  poller = msgq.Poller()
  sub = msgq.sub_sock(endpoint, poller=poller)
  tell('polling')
  got = []
  while len(got) < count and poller.poll(10_000):
    woke = time.monotonic_ns()
    while (m := sub.receive(non_blocking=True)) is not None: got.append([int.from_bytes(m[8:], 'little'), int.from_bytes(m[:8], 'little'), woke])
  tell(got)

def upstream_paced_publisher(endpoint: str, count: int, period: float) -> None:
  """openpilot's PubSocket: once told, `count` messages `period` s apart, each its send time (ns) and its id."""
  import msgq, time
  pub = msgq.pub_sock(endpoint)
  tell('publishing')
  listen()
  for i in range(count):
    time.sleep(period)
    pub.send(time.monotonic_ns().to_bytes(8, 'little') + i.to_bytes(4, 'little'))
  tell('sent')

def upstream_camera(width: int, height: int, frames: int, queue_sizes: dict) -> None:
  """openpilot's camerad and calibrationd: a VisionIpcServer 'camerad' (road and wide road), and before each frame its camera
  states and a calibration (openpilot's schema). Lockstep: the next frame once modelV2 for this one came, read by
  openpilot's SubSocket and schema. Reports [frameId, frameIdExtra, timestampEof, valid, position points] of each."""
  import msgq, time
  from msgq.visionipc import VisionIpcServer
  from openpilot_logging.cereal import log
  srv = VisionIpcServer('camerad')
  for stream in (0, 2): srv.create_buffers(stream, 4, width, height)
  srv.start_listener()
  pubs = {s: msgq.pub_sock(s, queue_sizes[s]) for s in ('roadCameraState', 'wideRoadCameraState', 'liveCalibration')}
  def publish(service: str, **fields) -> None:
    msg = log.Event.new_message(logMonoTime=time.monotonic_ns(), valid=True)
    msg.init(service)
    for k, v in fields.items(): setattr(getattr(msg, service), k, v)
    pubs[service].send(msg.to_bytes())
  tell('serving')
  listen()   # modeld is up, its modelV2 publisher made: a subscriber from now on stays registered
  sub = msgq.sub_sock('modelV2', timeout=10_000, segment_size=queue_sizes['modelV2'])
  image, got = bytes(range(256)) * (width * height * 3 // 2 // 256 + 1), []
  for n in range(1, frames + 1):
    sof, eof = n * 50_000_000, n * 50_000_000 + 20_000_000
    publish('liveCalibration', rpyCalib=[0., 0.02, -0.01], calStatus='calibrated')
    for service in ('roadCameraState', 'wideRoadCameraState'): publish(service, frameId=n, timestampSof=sof, timestampEof=eof, sensor='ar0231')
    for stream in (0, 2): srv.send(stream, image[:width * height * 3 // 2], n, sof, eof)
    if (dat := sub.receive()) is None: break
    with log.Event.from_bytes(dat) as e: got.append([e.modelV2.frameId, e.modelV2.frameIdExtra, e.modelV2.timestampEof, e.valid, len(e.modelV2.position.x)])
  tell(got)

def upstream_camera_client(stream: int) -> None:
  """openpilot's VisionIpcClient on 'camerad' (connected within 30 s): [packet frame id, trailer frame id, width, height,
  stride, uv_offset, bytes, sha256] of every frame until none comes for a second."""
  import hashlib, time
  from msgq.visionipc import VisionIpcClient
  c, deadline = VisionIpcClient('camerad', stream, False), time.monotonic() + 30
  tell('connecting')
  while not c.connect(False):
    if time.monotonic() > deadline: return tell('no server')
    time.sleep(0.01)
  got = []
  while (buf := c.recv(1000)) is not None:
    got.append([c.frame_id, buf.frame_id, buf.width, buf.height, buf.stride, buf.uv_offset, len(buf.data), hashlib.sha256(buf.data).hexdigest()])
  tell(got)

# ***** messages *****

def test_messages_from_ours_to_openpilots_whole_and_in_order(upstream):
  """SIZES through our publisher to openpilot's SubSocket: every message whole, in order, across the ring's wraps."""
  pub = msgq.pub_sock('interop')   # outside the services table: openpilot's default 1 MiB segment
  msgs = [payload(i, n) for i, n in enumerate(SIZES)]
  with Upstream(upstream, upstream_subscriber, 'interop', len(msgs)) as op:
    assert op.hear() == 'subscribed'
    for m in msgs:
      pub.send(m)
      if len(m) >= BIG: pub.wait_for_readers(5)
    assert op.hear() == [digest(m) for m in msgs]
  pub.close()

def test_messages_from_openpilots_to_ours_whole_and_in_order(upstream):
  """SIZES through openpilot's PubSocket to our subscriber: every message whole, in order, nothing more."""
  with Upstream(upstream, upstream_publisher, 'interop', SIZES, BIG) as op:
    assert op.hear() == 'publishing'
    sub = msgq.sub_sock('interop', timeout=5000)   # after openpilot's publisher: its start would evict a reader made before
    op.say('go')
    got = []
    while len(got) < len(SIZES) and (m := sub.receive()) is not None: got.append(m)
    assert op.hear() == 'sent' and sub.receive(non_blocking=True) is None
  assert [digest(m) for m in got] == [digest(payload(i, n)) for i, n in enumerate(SIZES)]
  sub.close()

def test_the_newest_publisher_wins_both_ways(upstream):
  """openpilot's rule across implementations: a newer publisher takes the endpoint, the older one's next send raises
  MultiplePublishersError (ours, then openpilot's), and readers get the newest publisher's messages only."""
  ours, sub = msgq.pub_sock('taken'), msgq.sub_sock('taken', timeout=2000)
  ours.send(b'first')
  assert sub.receive() == b'first'
  with Upstream(upstream, upstream_newer_publisher, 'taken') as op:
    assert op.hear() == 'publishing'
    with pytest.raises(msgq.MultiplePublishersError): ours.send(b'too old')
    assert sub.receive(non_blocking=True) is None   # re-registered with the new publisher; nothing of the old one's came
    op.say('theirs')
    assert op.hear() == 'sent' and sub.receive() == b'theirs'
    newest = msgq.pub_sock('taken')
    op.say('now too old')
    assert op.hear() == 'MultiplePublishersError' and 'Killing old publisher: taken' in op.output()
    assert sub.receive(non_blocking=True) is None
    newest.send(b'ours again')
    assert sub.receive() == b'ours again' and sub.receive(non_blocking=True) is None
  for s in (ours, newest, sub): s.close()

# ***** wake-ups *****

def test_poller_wakeups_both_ways_within_5ms(upstream):
  """A Poller blocked in poll(10 s) wakes when the other side publishes (SIGUSR2 to the polling thread, both ways):
  WAKEUPS messages PERIOD apart, each stamped with its send time; the median send -> wake-up under 5 ms."""
  pub = msgq.pub_sock('wake')
  with Upstream(upstream, upstream_poller, 'wake', WAKEUPS) as op:
    assert op.hear() == 'polling'
    for i in range(WAKEUPS):
      time.sleep(PERIOD)
      pub.send(time.monotonic_ns().to_bytes(8, 'little') + i.to_bytes(4, 'little'))
    got = op.hear()
  assert [g[0] for g in got] == list(range(WAKEUPS))
  to_openpilot = percentiles([(woke - sent) / 1e6 for _, sent, woke in got])

  with Upstream(upstream, upstream_paced_publisher, 'wake2', WAKEUPS, PERIOD) as op:
    assert op.hear() == 'publishing'
    poller = msgq.Poller()
    sub = msgq.sub_sock('wake2', poller=poller)
    op.say('go')
    got = []
    while len(got) < WAKEUPS and poller.poll(10_000):
      woke = time.monotonic_ns()
      got += [(int.from_bytes(m[8:], 'little'), int.from_bytes(m[:8], 'little'), woke) for m in msgq.drain_sock_raw(sub)]
    assert op.hear() == 'sent'
  assert [g[0] for g in got] == list(range(WAKEUPS))
  to_ours = percentiles([(woke - sent) / 1e6 for _, sent, woke in got])
  print(f"wake-up latency (ms) over {WAKEUPS} messages, ours -> openpilot's Poller: {show(to_openpilot)}; openpilot's -> our Poller: {show(to_ours)}")
  assert to_openpilot['p50'] < 5 and to_ours['p50'] < 5, (to_openpilot, to_ours)
  pub.close(); sub.close()

# ***** openpilot's own tests *****

@pytest.mark.parametrize('transport', ['shm', 'zmq'])
def test_openpilots_own_python_tests_pass_on_ours(transport, monkeypatch, tmp_path):
  """openpilot's test_messaging, test_poller and test_visionipc (14 tests), unchanged from the source folder, with the
  project's msgq as their `msgq`: on the shm transport and on the default (zmq). Nothing is written in the source folder."""
  src = source()
  if transport == 'zmq': monkeypatch.delenv('MSGQ_TRANSPORT')
  before = source_files(src)
  summary, out = run_openpilot_tests([src / f for f in OPENPILOT_TESTS], tmp_path, dict(os.environ))
  assert summary == {'run': 14, 'failed': [], 'skipped': 0}, out
  assert source_files(src) == before

# ***** the daemons *****

def test_modeld_on_openpilots_camera_and_messages(upstream, tiny_artifacts):
  """openpilot's VisionIpcServer serves road and wide road frames and its publishers the camera states and calibration
  (openpilot's schema); modeld, a real process on the shm transport, answers each frame with a modelV2 that
  openpilot's SubSocket reads and openpilot's schema parses: its frame ids, times, and valid (the calibration was read)."""
  sizes = {s: SERVICES[s].queue_size for s in ('roadCameraState', 'wideRoadCameraState', 'liveCalibration', 'modelV2')}
  frames = 8
  with Upstream(upstream, upstream_camera, LAYOUT.width, LAYOUT.height, frames, sizes) as op:
    assert op.hear() == 'serving'
    d, notify = start_daemon('modeld', tiny_artifacts)
    try:
      op.say('go')
      got = op.hear(60)
    finally:
      rc, _ = d.stop()
      notify.close()
  want = [[n, n, n * 50_000_000 + 20_000_000, True, 33] for n in range(1, frames + 1)]
  assert got == want and rc == 0, (got, d.stderr())

def test_camerad_feeds_openpilots_visionipc_client(upstream, scene):
  """camerad (a real process, synthetic scene, real time) serves the road camera to openpilot's VisionIpcClient in
  another process: consecutive frame ids up to the scene's last, the trailer's frame id the packet's, the layout's
  geometry, and the pixels of the frame each id names."""
  sc = load_scene(scene)
  with Upstream(upstream, upstream_camera_client, 0) as op:
    assert op.hear() == 'connecting'
    p = subprocess.Popen([sys.executable, '-m', 'camerad', '--source', f'synthetic:{scene}', '--cameras', 'road', '--fps', '40'],
                         cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
      got = op.hear(60)
      _, err = p.communicate(timeout=20)
    finally:
      if p.poll() is None: p.kill(); p.wait()
  assert p.returncode == 0 and isinstance(got, list), (err, got)
  ids = [g[0] for g in got]
  assert len(ids) >= sc.n_frames // 2 and ids == list(range(ids[0], sc.n_frames)), (ids, op.output())
  assert all(g[1] == g[0] for g in got), 'the buffer trailer frame id differs from the packet'
  render = SceneRenderer(sc, 'road', LAYOUT)
  for fid, _, *geometry, digest_ in got:
    assert geometry == [LAYOUT.width, LAYOUT.height, LAYOUT.stride, LAYOUT.uv_offset, LAYOUT.size], geometry
    assert digest_ == hashlib.sha256(render.render(fid).tobytes()).hexdigest(), f'frame {fid}: not the scene frame'
