"""VisionIPC among other local users: a socket or lock of another account (nobody's, tests/accounts.py) refused by name
and its buffers never mapped, the socket and lock 0600 whatever the umask, a camera server that shrinks a buffer under
a real daemon, and a flood of requests that its log does not follow line for line."""
import grp, inspect, os, pwd, signal, socket, stat, subprocess, sys, threading, time
import numpy as np
import pytest
from cereal import messaging
from cereal.services import CAMERA_STATE_SERVICES
from msgq import pub_sock
from msgq.visionipc import DRIVER, ROAD, VisionIpcClient, VisionIpcServer
from msgq.visionipc.buffers import Buffers, VisionBuf
from msgq.visionipc.wire import PACKET, TRAILER, endpoint, request, socket_path
from service import RateLimit
from service.owned import NotOwnedError
from tests.accounts import nobody_uid, popen_as_nobody
from tests.artifacts import LAYOUT, REPO
from tests.daemon_harness import Camera, Collector, Daemon, Notify, start_daemon

L = (LAYOUT.width, LAYOUT.height, LAYOUT.stride, LAYOUT.uv_offset, LAYOUT.size)

def serve_buffers(sock, stream: int, layout: tuple, fds: list, server_id: int, say) -> None:
  """A VisionIPC server's handshake as openpilot's, in the standard library alone (it also runs as nobody): the stream
  list, then the stream's buffers with their fds, until the listening socket is shut down. say(): each connection
  ('accepted') and request ('request N')."""
  import socket, struct
  rec = struct.Struct("=QQQQi4xQQQQQQQQIi")
  w, h, stride, uv_offset, size = layout
  while True:
    try: c = sock.accept()[0]
    except OSError: return
    say("accepted")
    if len(req := c.recv(64)) == 4:
      say(f"request {(t := struct.unpack('=I', req)[0])}")
      if t == 0xFFFFFFFF: c.send(struct.pack("=I", stream))
      elif t == stream:
        socket.send_fds(c, [b"".join(rec.pack(size, size + 8, 0, 0, fd, w, h, stride, uv_offset, 0, 0, server_id, i, stream, 0)
                                     for i, fd in enumerate(fds))], fds)
    c.close()

def squat(path: str | None, stream: int = ROAD, lock: str | None = None, hold: bool = False) -> subprocess.Popen:
  """nobody's process: a VisionIPC server at path (its socket 0777, the stream's one buffer in a memfd named 'squat', of
  the tests' layout), and/or the lock file, held or left stale. Its stdout: 'ready', then serve_buffers' lines."""
  p = popen_as_nobody(inspect.getsource(serve_buffers) + f"""
import fcntl, os, socket, time
if {lock!r}:
  fd = os.open({lock!r}, os.O_RDWR | os.O_CREAT, 0o644)
  if {hold!r}: fcntl.flock(fd, fcntl.LOCK_EX)
if {path!r}:
  s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
  s.bind({path!r})
  os.chmod({path!r}, 0o777)
  s.listen(8)
  buf = os.memfd_create("squat")
  os.ftruncate(buf, {L[4] + TRAILER})
print("ready", flush=True)
if {path!r}: serve_buffers(s, {int(stream)}, {L!r}, [buf], 7, lambda line: print(line, flush=True))
else: time.sleep(3600)
""")
  assert p.stdout.readline() == "ready\n", p.stderr.read()
  return p

def lines_of(p: subprocess.Popen, n: int, timeout: float = 20) -> list[str]:
  """The squatter's next n lines (it prints one per connection and request)."""
  out, t = [], threading.Thread(target=lambda: out.extend(p.stdout.readline().strip() for _ in range(n)), daemon=True)
  t.start()
  t.join(timeout)
  assert len(out) == n, f"the squatter said {out} within {timeout} s, expected {n} lines"
  return out

@pytest.fixture
def shm(monkeypatch):
  """The shm transport: the VisionIPC socket and lock in /tmp, where every account can make files."""
  monkeypatch.setenv("MSGQ_TRANSPORT", "shm")

def memfds_mapped(pid: int | str = "self") -> list[str]:
  return [l for l in open(f"/proc/{pid}/maps") if "memfd:squat" in l]

def test_a_client_refuses_a_server_of_another_account_and_never_maps_its_buffers(shm, monkeypatch, tmp_path):
  """nobody serves VisionIPC on our prefix first (as it did before root's camerad): every way in refuses it by name,
  before a request is sent, so no fd of its ever reaches us. Under MSGQ_GROUP of its group, it is taken."""
  uid = nobody_uid()
  p = squat(path := socket_path("camerad"))
  try:
    c = VisionIpcClient("camerad", ROAD)
    assert not c.connect(blocking=False)
    assert f"uid {uid} (nobody)" in c.connect_error and path in c.connect_error and "refused" in c.connect_error
    assert VisionIpcClient.available_streams("camerad", False) == set() and VisionIpcClient.server_info("camerad") is None
    with pytest.raises(NotOwnedError, match=f"uid {uid}"): request("camerad", ROAD)
    assert lines_of(p, 4) == ["accepted"] * 4   # connected four times, never asked: no reply, no fd
    assert not memfds_mapped() and not c.is_connected()
    monkeypatch.setenv("MSGQ_GROUP", str(pwd.getpwuid(uid).pw_gid))   # nobody's group made part of the stack: its server is ours
    monkeypatch.setenv("MSGQ_RUNTIME_DIR", str(tmp_path))   # the stack's removal shares no folder of root's with that group
    assert c.connect(blocking=False) and memfds_mapped()
    c.close()
  finally: p.kill()

def test_a_daemon_waits_past_a_squatter_for_a_camera_of_its_own_user(shm, tiny_artifacts):
  """root's dmonitoringd with nobody's camera server on its prefix: it never maps that server's buffers nor gets ready,
  says why by name, and connects to the real camera once one of its user's serves (the admin removed the file)."""
  uid = nobody_uid()
  p = squat(path := socket_path("camerad"), DRIVER)
  notify = Notify(abstract=True)
  d = Daemon("dmonitoringd", tiny_artifacts, "--stats-interval", "0", notify=notify)
  cam = None
  try:
    assert lines_of(p, 5, timeout=90) == ["accepted"] * 5   # it came five times (every 0.1 s), refused before asking
    assert not memfds_mapped(d.proc.pid) and d.proc.poll() is None
    assert not any("READY=1" in m for m in notify.messages)
    p.kill(); p.wait()
    os.unlink(path)
    cam = Camera({DRIVER: LAYOUT})
    notify.wait("READY=1", 60)
    notify.wait_count("connects", 1)
  finally:
    p.kill()
    rc, _ = d.stop()
    if cam is not None: cam.close()
    notify.close()
  assert rc == 0 and f"VisionIPC server 'camerad' at {path}: its peer runs as uid {uid} (nobody)" in d.stderr()

def test_a_server_refuses_a_socket_of_another_account_at_its_path(shm):
  """A socket file of nobody's where our server binds is refused by name, not replaced (root could unlink it)."""
  uid = nobody_uid()
  p = squat(path := socket_path("camerad"))
  try:
    srv = VisionIpcServer("camerad")
    srv.create_buffers(ROAD, 2, 64, 48)
    with pytest.raises(NotOwnedError, match=rf"VisionIPC socket {path} belongs to uid {uid} \(nobody\)"): srv.start_listener()
    srv.close()
    assert os.stat(path).st_uid == uid
  finally: p.kill()

@pytest.mark.parametrize("hold", [True, False], ids=["held", "stale"])
def test_camerad_exits_naming_a_lock_file_of_another_account(shm, hold, scene):
  """nobody's VisionIPC lock at camerad's path, held by its process or left behind: camerad exits 1 with one line
  naming the file and its owner, no traceback, and serves nothing."""
  uid = nobody_uid()
  p = squat(None, lock=(lock := socket_path("camerad") + ".lock"), hold=hold)
  try:
    r = subprocess.run([sys.executable, "-m", "camerad", "--source", f"synthetic:{scene}", "--frames", "3"], cwd=REPO,
                       capture_output=True, text=True, timeout=60)
  finally: p.kill()
  assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
  assert f"VisionIPC lock {lock} belongs to uid {uid} (nobody)" in r.stderr, r.stderr
  assert not os.path.exists(socket_path("camerad"))

@pytest.mark.parametrize("transport", ["shm", "zmq"])
@pytest.mark.parametrize("shared", [False, True], ids=["private", "MSGQ_GROUP"])
def test_socket_and_lock_are_private_under_umask_0(transport, shared, monkeypatch, tmp_path):
  """The socket and lock files are 0600 (MSGQ_GROUP: 0660 and that group) even where the umask would leave them
  0777: bind() gives the socket its mode from the start."""
  monkeypatch.setenv("MSGQ_TRANSPORT", transport)
  group = next(g.gr_gid for g in grp.getgrall() if g.gr_gid != os.getegid()) if shared else None
  if shared: monkeypatch.setenv("MSGQ_GROUP", str(group))
  monkeypatch.setenv("MSGQ_RUNTIME_DIR", str(tmp_path))   # a runtime directory of its own: root's is never given that group
  old = os.umask(0)
  try:
    with VisionIpcServer("camerad") as srv:
      srv.create_buffers(ROAD, 2, 64, 48)
      srv.start_listener()
      for f in (srv.path, srv.path + ".lock"):
        st = os.lstat(f)
        assert (stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid) == ((0o660, os.geteuid(), group) if shared else (0o600, os.geteuid(), st.st_gid)), f
  finally: os.umask(old)

class UnsealedServer:
  """openpilot's kind of camera server, of our own user: its buffers are files that are not sealed (openpilot's are
  unlinked tmpfs files), so it can shrink one under its clients' mappings. The handshake is serve_buffers' in a thread,
  the frames go out as VisionIpcServer's; get_free_buffer and publish as VisionIpcServer's, for the harness's Camera."""
  def __init__(self, name: str, stream: int, count: int = 4):
    self.fds = [os.memfd_create(f"unsealed_{i}") for i in range(count)]
    for fd in self.fds: os.ftruncate(fd, LAYOUT.size + TRAILER)
    self.bufs, self.next, self.server_id = Buffers(self.fds, LAYOUT, writable=True), 0, 0x5eed
    self.pub = pub_sock(endpoint(name, stream))
    self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    self.sock.bind(path := socket_path(name))
    self.sock.listen(8)
    self.thread = threading.Thread(target=serve_buffers, args=(self.sock, stream, L, self.fds, self.server_id, lambda line: None))
    self.thread.start()
    self.path = path

  def get_free_buffer(self, stream: int) -> VisionBuf:
    idx, self.next = self.next, (self.next + 1) % len(self.fds)
    return VisionBuf(self.bufs, idx, stream)

  def publish(self, stream: int, buf: VisionBuf, frame_id: int, sof: int = 0, eof: int = 0) -> None:
    self.bufs.set_frame_id(buf.idx, frame_id)
    self.announce(buf.idx, frame_id, sof, eof)

  def announce(self, idx: int, frame_id: int, sof: int = 0, eof: int = 0) -> None:
    self.pub.send(PACKET.pack(self.server_id, idx, frame_id, sof, eof, True))

  def close(self) -> None:
    self.sock.shutdown(socket.SHUT_RDWR)
    self.thread.join()
    self.sock.close()
    os.unlink(self.path)
    self.pub.close()
    assert self.bufs.close()
    for fd in self.fds: os.close(fd)

class UnsealedCamera(Camera):
  """The harness's camera (its camera-state message, then the frame) on an UnsealedServer."""
  def __init__(self, stream: int):
    self.layouts, self.sensor, self.server = {stream: LAYOUT}, "ar0231", UnsealedServer("camerad", stream)
    self.pm = messaging.PubMaster([CAMERA_STATE_SERVICES[stream]])
    self.images = {stream: np.random.default_rng(0).integers(0, 256, LAYOUT.size, dtype=np.uint8)}

def test_a_buffer_shrunk_under_a_daemon_refuses_the_frame_and_it_reconnects(tiny_artifacts):
  """A camera server of our own user with unsealed buffers (as openpilot's) truncates one and announces a frame in it:
  dmonitoringd refuses that frame by name instead of dying of SIGBUS, reconnects once the buffer is whole again and
  answers the frames that follow."""
  cam = UnsealedCamera(DRIVER)
  d, notify = start_daemon("dmonitoringd", tiny_artifacts, "--stats-interval", "0", "--model-only", abstract=True)
  col = Collector(["driverStateV2"])
  try:
    for n in range(1, 4):
      cam.send(n)
      assert col.wait("driverStateV2", n)[-1].driverStateV2.frameId == n
    fd = cam.server.fds[idx := cam.server.next]
    os.ftruncate(fd, 0)          # the next buffer, shrunk under the daemon's mapping
    cam.server.announce(idx, 4)  # a frame in it: reading it would be a SIGBUS
    notify.wait_count("disconnects", 1)
    os.ftruncate(fd, LAYOUT.size + TRAILER)
    notify.wait_count("connects", 2)
    for n in range(5, 10):
      cam.send(n)
      assert col.wait("driverStateV2", n - 1)[-1].driverStateV2.frameId == n
  finally:
    rc, _ = d.stop()
    cam.close(); col.close(); notify.close()
  assert rc == 0, rc
  assert f"frame 4 refused: VisionIPC server 'camerad' stream {int(DRIVER)}: buffer {idx} is a file of 0 bytes now" in d.stderr()

def test_requests_for_missing_streams_do_not_flood_the_log(scene):
  """A client asking camerad for 500 streams it lacks, one connection each: its log says so a bounded number of times
  (a burst, then one line per interval), not once per request."""
  notify = Notify(abstract=True)
  p = subprocess.Popen([sys.executable, "-m", "camerad", "--source", f"synthetic:{scene}", "--loop"], cwd=REPO,
                       stderr=subprocess.PIPE, text=True, env={**os.environ, "NOTIFY_SOCKET": notify.addr})
  try:
    notify.wait("READY=1", 60)
    t0 = time.monotonic()
    for stream in range(100, 600): assert request("camerad", stream) == (b"", [])   # closed without a reply, as openpilot's
    elapsed = time.monotonic() - t0
  finally:
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=30)
    notify.close()
  said = [l for l in err.splitlines() if "a client asked for stream" in l]
  print(f"{len(said)} lines for 500 requests in {elapsed:.2f} s")
  assert p.returncode == 0 and 1 <= len(said) <= RateLimit().burst + 2 + elapsed / RateLimit().interval, (elapsed, said)

def test_reconnects_forced_by_a_camera_server_do_not_flood_the_daemons_log(tiny_artifacts):
  """Packets of unknown servers on the frame topic, each a reconnect (30 of them): dmonitoringd reconnects each time
  and goes on, its log saying so a bounded number of times."""
  cam = Camera({DRIVER: LAYOUT})
  d, notify = start_daemon("dmonitoringd", tiny_artifacts, "--stats-interval", "0", "--model-only", abstract=True)
  t0 = time.monotonic()
  try:
    for n in range(30):
      cam.server._stream(DRIVER).pub.send(PACKET.pack(0xbad0 + n, 0, n, 0, 0, True))
      notify.wait_count("connects", n + 2)
    elapsed = time.monotonic() - t0
  finally:
    rc, _ = d.stop()
    cam.close(); notify.close()
  said = [l for l in d.stderr().splitlines() if "connected to 'camerad'" in l]
  print(f"{len(said)} lines for 30 reconnects in {elapsed:.2f} s")
  assert rc == 0 and 2 <= len(said) <= 1 + RateLimit().burst + 2 + elapsed / RateLimit().interval, (elapsed, said)
