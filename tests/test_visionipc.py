"""VisionIPC with real processes, real shared memory and real sockets, on both transports: servers in child processes
driven over a pipe, clients here or in their own processes. Against openpilot's own bytes: tests/test_golden_msgq.py."""
import glob, multiprocessing as mp, os, signal, socket, stat, sys, time, uuid
import numpy as np
import pytest
from msgq import remove_stack, runtime_dir
from msgq.visionipc import VisionIpcServer, VisionIpcClient, VisionStreamType, NV12Layout, ROAD, DRIVER, WIDE_ROAD
from msgq.visionipc.wire import PACKET, REQUEST

ctx = mp.get_context("spawn")
PADDED = NV12Layout.aligned(96, 64)   # stride 128, UV at 8192: padding after every row and between the planes
PACKED = NV12Layout.packed(64, 48)

def frame_bytes(layout: NV12Layout, frame_id: int) -> np.ndarray:
  """Every byte depends on its position and the frame: a shifted or torn read cannot match."""
  return ((np.arange(layout.size, dtype=np.uint32) * 7 + frame_id * 13 + (np.arange(layout.size) // layout.stride)) % 251).astype(np.uint8)

def planes(arr: np.ndarray, l: NV12Layout) -> tuple[np.ndarray, np.ndarray]:
  uv = arr[l.uv_offset:l.uv_offset + l.stride * l.height // 2]
  return arr[:l.stride * l.height].reshape(l.height, l.stride)[:, :l.width], uv.reshape(l.height // 2, l.stride)[:, :l.width]

# ***** processes *****

def server_main(name: str, conn) -> None:
  """A server process that does what the pipe tells it, replying to each command."""
  srv = VisionIpcServer(name)
  while True:
    cmd, *args = conn.recv()
    if cmd == "create":
      stream, count, layout = args
      l = NV12Layout.parse(layout)
      srv.create_buffers_with_sizes(stream, count, l.width, l.height, l.size, l.stride, l.uv_offset)
    elif cmd == "listen": srv.start_listener()
    elif cmd == "send":      # copy path
      stream, frame_ids = args
      for f in frame_ids: srv.send(stream, frame_bytes(srv._stream(stream).bufs.layout, f), f, f * 10, f * 10 + 5)
    elif cmd == "fill":      # zero-copy path: taken, filled in place, published
      stream, frame_ids = args
      for f in frame_ids:
        buf = srv.get_free_buffer(stream)
        buf.array[:] = frame_bytes(buf.layout, f)
        srv.publish(stream, buf, f, f * 10, f * 10 + 5)
    elif cmd == "take": srv.get_free_buffer(args[0])
    elif cmd == "raw": srv._stream(args[0]).pub.send(args[1])   # bytes on the stream's topic, as a broken server would
    elif cmd == "exit": conn.send("bye"); sys.exit(0)            # no close(): the interpreter's exit must clean up
    elif cmd == "close": srv.close(); conn.send("closed"); return
    elif cmd == "readers": conn.send((srv._stream(args[0]).pub.all_readers_updated(), srv.has_readers(args[0]))); continue   # subscribed, has_readers
    conn.send(("ok", srv.server_id))

def streamer_main(name: str, layout: str, count: int, started) -> None:
  """A camera that sends a frame every 5 ms until killed."""
  l = NV12Layout.parse(layout)
  srv = VisionIpcServer(name)
  srv.create_buffers_with_sizes(ROAD, count, l.width, l.height, l.size, l.stride, l.uv_offset)
  srv.start_listener()
  started.set()
  f = 0
  while True:
    srv.send(ROAD, frame_bytes(l, f), f)
    f += 1
    time.sleep(0.005)

def client_main(name: str, stream: int, n: int, out) -> None:
  """Receives n frames and reports (frame_id, pixel-exact, torn) for each."""
  c = VisionIpcClient(name, stream, False)
  assert c.connect(True)
  out.put("connected")
  got = []
  while len(got) < n and (buf := c.recv(5000)) is not None:
    got.append((buf.frame_id, bool((buf.array == frame_bytes(buf.layout, buf.frame_id)).all()), buf.overwritten()))
  out.put(got)

def restart_client_main(name: str, out, stop) -> None:
  """Runs through server crashes: reconnects, reports (server_id, frame_id, layout, pixel-exact, torn) per frame."""
  c = VisionIpcClient(name, ROAD, True)
  while not stop.is_set():
    if not c.is_connected():
      c.connect(True)
      out.put(("connected", c.server_id, c.release_old_mappings()))
    if (buf := c.recv(50)) is not None:
      ok = bool((buf.array == frame_bytes(buf.layout, buf.frame_id)).all())
      out.put(("frame", c.server_id, buf.frame_id, str(buf.layout), ok or buf.overwritten()))
      del buf
  out.put(("done", c.release_old_mappings()))

class Server:
  """The test's handle on a server process."""
  def __init__(self, name: str):
    self.conn, child = ctx.Pipe()
    self.proc = ctx.Process(target=server_main, args=(name, child), daemon=True)
    self.proc.start()
  def __call__(self, *cmd):
    self.conn.send(cmd)
    assert self.conn.poll(20), f"server did not answer {cmd[0]}"
    return self.conn.recv()
  def close(self):
    if self.proc.is_alive():
      assert self("close") == "closed"
      self.proc.join(5)

@pytest.fixture(params=["zmq", "shm"])
def name(request, monkeypatch):
  monkeypatch.setenv("OPENPILOT_PREFIX", f"vipc-{uuid.uuid4().hex[:8]}")
  monkeypatch.setenv("MSGQ_TRANSPORT", request.param)
  yield "camerad"
  remove_stack()   # this prefix's: conftest removes only its own

@pytest.fixture
def server(name):
  s = Server(name)
  yield s
  s.close()

def server_sockets() -> list[str]:
  """The VisionIPC socket files of this prefix: openpilot's place in /tmp on shm, msgq's runtime directory on zmq."""
  paths = glob.glob(f"/tmp/{os.environ['OPENPILOT_PREFIX']}_visionipc_*") if os.environ["MSGQ_TRANSPORT"] == "shm" else \
          [os.path.join(runtime_dir(), f) for f in os.listdir(runtime_dir())]
  return [p for p in paths if stat.S_ISSOCK(os.stat(p).st_mode)]

# ***** tests *****

def test_padded_frames_cross_processes_pixel_exact(name, server):
  server("create", ROAD, 8, str(PADDED))
  server("create", DRIVER, 4, str(PACKED))
  server("listen")
  assert VisionIpcClient.available_streams(name, False) == {ROAD, DRIVER}
  other = ctx.Queue()
  p = ctx.Process(target=client_main, args=(name, ROAD, 12, other))
  p.start()
  c, d = VisionIpcClient(name, ROAD, False), VisionIpcClient(name, DRIVER, False)
  assert c.connect(False) and d.connect(True)
  assert other.get(timeout=20) == "connected"
  assert (c.width, c.height, c.stride, c.uv_offset, c.buffer_len, c.num_buffers) == (96, 64, 128, 8192, PADDED.size, 8)
  server("send", DRIVER, [100])
  for batch, how in ((range(6), "fill"), (range(6, 12), "send")):   # 6 frames at a time: the 8 buffers do not wrap under us
    server(how, ROAD, batch)
    for f in batch:
      buf = c.recv(2000)
      assert (buf.frame_id, buf.idx, buf.stream, buf.timestamp_sof, buf.timestamp_eof) == (f, f % 8, ROAD, f * 10, f * 10 + 5)
      assert (c.frame_id, c.timestamp_sof, c.timestamp_eof) == (f, f * 10, f * 10 + 5)
      assert buf.addr % 4096 == 0 and buf.layout == PADDED and len(buf.data) == buf.size == PADDED.size and buf.data.readonly
      want = frame_bytes(PADDED, f)
      for got_plane, want_plane in zip(planes(buf.array, PADDED), planes(want, PADDED)): assert np.array_equal(got_plane, want_plane)
      assert np.array_equal(buf.array, want) and not buf.overwritten()
  assert c.recv(50) is None
  buf = d.recv(2000)
  assert (buf.frame_id, buf.stream, buf.addr % 64) == (100, DRIVER, 0) and np.array_equal(buf.array, frame_bytes(PACKED, 100))
  assert [(f, ok or torn) for f, ok, torn in other.get(timeout=20)] == [(f, True) for f in range(12)]   # exact unless flagged torn
  p.join(5)
  c.close(); d.close()

def test_conflate_keeps_the_newest(name, server):
  server("create", ROAD, 4, str(PACKED))
  server("listen")
  c, q = VisionIpcClient(name, ROAD, True), VisionIpcClient(name, ROAD, False)
  assert c.connect(True) and q.connect(True)
  server("send", ROAD, range(10))
  got = [q.recv(1000) for _ in range(10)]   # the whole burst is out: q has every frame of it
  assert [b.frame_id for b in got] == list(range(10))
  seen = []   # c's copies come on a connection of their own: read until the newest, which ends what c has
  while (buf := c.recv(1000)) is not None:
    seen.append(buf.frame_id)
    if buf.frame_id == 9: break
  assert seen[-1:] == [9] and seen == sorted(seen) and len(seen) < 10   # older frames replaced, not queued
  assert np.array_equal(buf.array, frame_bytes(PACKED, 9)) and c.recv(50) is None
  # a slow no-conflate client: the first six buffers were reused before it looked (4 buffers, 10 frames)
  assert [b.overwritten() for b in got] == [True] * 6 + [False] * 4
  del buf, got
  c.close(); q.close()

def test_torn_frame_detected_when_the_ring_wraps(name, server):
  server("create", ROAD, 4, str(PACKED))
  server("listen")
  c = VisionIpcClient(name, ROAD, False)
  assert c.connect(True)
  server("fill", ROAD, [0])
  buf = c.recv(1000)
  server("fill", ROAD, [1, 2, 3])
  assert not buf.overwritten() and np.array_equal(buf.array, frame_bytes(PACKED, 0))
  server("take", ROAD)            # the producer starts writing buffer 0 again: torn from this moment on
  assert buf.overwritten()
  server("fill", ROAD, [4])       # and still after it published another frame in it
  assert buf.overwritten()
  del buf
  c.close()

def test_64_buffers_and_a_4096x3072_frame(name, server):
  big = NV12Layout.packed(4096, 3072)
  server("create", ROAD, 64, str(PACKED))
  server("create", WIDE_ROAD, 2, str(big))
  server("listen")
  c, w = VisionIpcClient(name, ROAD, False), VisionIpcClient(name, VisionStreamType.WIDE_ROAD, False)
  assert c.connect(True) and w.connect(True) and c.num_buffers == 64
  server("fill", ROAD, range(64))
  bufs = [c.recv(2000) for _ in range(64)]
  assert [b.idx for b in bufs] == list(range(64)) and len({b.addr for b in bufs}) == 64
  assert all(np.array_equal(b.array, frame_bytes(PACKED, b.frame_id)) and not b.overwritten() for b in bufs)
  server("send", WIDE_ROAD, [7])
  buf = w.recv(5000)
  assert (buf.width, buf.height, buf.size) == (4096, 3072, big.size) and np.array_equal(buf.array, frame_bytes(big, 7))
  del bufs, buf
  c.close(); w.close()

def test_from_blob_reads_the_shared_frame(name, server, monkeypatch):
  monkeypatch.setenv("DEV", "CPU")
  from tinygrad import Tensor, dtypes
  server("create", ROAD, 2, str(PADDED))
  server("listen")
  c = VisionIpcClient(name, ROAD, False)
  assert c.connect(True)
  server("fill", ROAD, [3])
  buf = c.recv(2000)
  t = Tensor.from_blob(buf.addr, (buf.size,), dtype=dtypes.uint8, device="CPU")
  y = t[:PADDED.stride * PADDED.height].reshape(PADDED.height, PADDED.stride)[:, :PADDED.width]
  assert np.array_equal(y.numpy(), planes(frame_bytes(PADDED, 3), PADDED)[0])
  del t, y, buf
  c.close()

def test_unknown_stream_and_no_server(name, server):
  assert not (c := VisionIpcClient(name, ROAD, False)).connect(False) and c.connect_error is None   # nothing listening yet
  assert VisionIpcClient.available_streams(name, False) == set()
  server("create", ROAD, 2, str(PACKED))
  server("listen")
  c = VisionIpcClient(name, DRIVER, False)
  assert not c.connect(True) and not c.is_connected() and c.recv(10) is None
  assert c.connect_error == f"server {name!r} does not serve stream 1 (it serves [0])"
  c.close()

def test_garbage_packets_are_counted_and_ignored(name, server):
  sid = server("create", ROAD, 4, str(PACKED))[1]
  server("listen")
  c = VisionIpcClient(name, ROAD, False)
  assert c.connect(True)
  good = PACKET.pack(sid, 1, 5, 0, 0, True)   # openpilot's client aborts on a packet of another size: ours counts it
  for junk in (b"x", good[:-1], good + b"\0", os.urandom(200)): server("raw", ROAD, junk)
  server("fill", ROAD, [0])
  buf = c.recv(2000)
  assert buf.frame_id == 0 and c.bad_packets == 4 and c.is_connected() and c.reconnects == 0
  server("raw", ROAD, PACKET.pack(sid, 4, 5, 0, 0, True))          # idx out of range
  assert c.recv(2000) is None and not c.is_connected() and c.reconnects == 1
  assert c.connect(True)
  server("raw", ROAD, PACKET.pack(sid ^ 2, 0, 5, 0, 0, True))      # a server we never met
  assert c.recv(2000) is None and not c.is_connected() and c.reconnects == 2 and c.bad_packets == 4
  assert c.connect(True) and c.release_old_mappings() == 1   # buf still maps the first mapping
  del buf
  assert c.release_old_mappings() == 0
  server("fill", ROAD, [1])
  assert c.recv(2000).frame_id == 1
  c.close()

def test_server_sigkilled_and_restarted_under_a_running_client(name):
  started, out, stop = ctx.Event(), ctx.Queue(), ctx.Event()
  a = ctx.Process(target=streamer_main, args=(name, str(PACKED), 4, started), daemon=True)
  a.start()
  assert started.wait(20)
  client = ctx.Process(target=restart_client_main, args=(name, out, stop), daemon=True)
  client.start()
  events = [out.get(timeout=20) for _ in range(6)]
  assert events[0][0] == "connected" and all(e[0] == "frame" for e in events[1:])
  os.kill(a.pid, signal.SIGKILL)
  a.join(5)
  assert server_sockets()   # the crash left its socket files behind
  time.sleep(0.2)                   # the outage itself, not a wait: the client keeps receiving against the stale socket
  started.clear()
  b = ctx.Process(target=streamer_main, args=(name, str(PADDED), 3, started), daemon=True)
  b.start()
  assert started.wait(20)
  deadline, frames = time.monotonic() + 20, []
  while time.monotonic() < deadline and not any(e[0] == "frame" and e[3] == str(PADDED) for e in frames[-3:]):
    frames.append(out.get(timeout=20))
  stop.set()
  while (e := out.get(timeout=20))[0] != "done": frames.append(e)
  os.kill(b.pid, signal.SIGKILL)
  client.join(5)
  assert client.exitcode == 0 and e == ("done", 0)   # old mappings released once the client dropped its buffers
  connects = [e for e in events + frames if e[0] == "connected"]
  assert len(connects) == 2 and connects[0][1] != connects[1][1]
  seen = {(e[1], e[3]) for e in events + frames if e[0] == "frame"}
  assert seen == {(connects[0][1], str(PACKED)), (connects[1][1], str(PADDED))}
  assert all(e[4] for e in events + frames if e[0] == "frame")   # every frame pixel-exact (or flagged torn)

def test_no_files_left_after_exit(name):
  def ours() -> list[str]: return sorted(f for f in os.listdir("/dev/shm") if os.environ["OPENPILOT_PREFIX"] in f)
  before = ours()   # the buffers are memfds: nothing of this test's stack may appear here (others' files are not looked at)
  for how in ("close", "exit"):
    s = Server(name)
    s("create", ROAD, 4, str(PACKED))
    s("listen")
    assert server_sockets()
    with open(f"/proc/{s.proc.pid}/maps") as f: assert "/memfd:visionipc_camerad_0_3 (deleted)" in f.read()   # buffer 3 of 4
    c = VisionIpcClient(name, ROAD, False)
    assert c.connect(True)
    s("send", ROAD, [1])
    assert c.recv(2000).frame_id == 1
    assert s(how) in ("closed", "bye")
    s.proc.join(5)
    assert s.proc.exitcode == 0
    c.close()
    assert server_sockets() == [] and not [f for f in os.listdir(runtime_dir()) if f.startswith("visionipc_camerad.")]
  new = [f for f in ours() if f not in before]
  if os.environ["MSGQ_TRANSPORT"] == "zmq": assert new == []
  else:   # the frame packets' queue file stays, as openpilot's msgq keeps them: its header is the queue's state
    assert new == [f"msgq_{os.environ['OPENPILOT_PREFIX']}"] and os.listdir(f"/dev/shm/{new[0]}") == ["visionipc_camerad_0"]

def test_second_server_with_the_same_name_is_refused(name, server):
  server("listen")
  with pytest.raises(Exception, match="already running"): VisionIpcServer(name)

def test_a_client_of_the_previous_server_is_not_a_reader_of_the_next(name):
  """A camera process restarted under a connected client: the client's subscription to the name's frame packets
  reconnects to the new server, but counts as a reader only once the client took the new server's buffers (a lockstep
  camera would otherwise send its first frame to a client that drops it to reconnect, and wait for its answer forever)."""
  def wait(cond):
    deadline = time.monotonic() + 5
    while not (ok := cond()) and time.monotonic() < deadline: time.sleep(0.01)
    return ok
  a = Server(name)
  a("create", ROAD, 2, str(PACKED)); a("listen")
  c = VisionIpcClient(name, ROAD, False)
  assert c.connect(True) and wait(lambda: a("readers", ROAD)[1])
  a.close()
  b = Server(name)
  try:
    b("create", ROAD, 2, str(PACKED)); b("listen")
    # the old client's subscription reaches the new server when it polls, as a daemon's recv does (ZMQ re-subscribes,
    # shm re-registers in the queue its new publisher reset)
    assert wait(lambda: c.recv(20) is None and b("readers", ROAD)[0])
    assert b("readers", ROAD)[1] is False
    c.close()
    c = VisionIpcClient(name, ROAD, False)
    assert c.connect(True) and wait(lambda: b("readers", ROAD)[1])
    b("send", ROAD, [7])
    assert c.recv(2000).frame_id == 7
  finally:
    c.close()
    b.close()

def test_send_checks_the_frame_size(name):
  with VisionIpcServer(name) as s:
    s.create_buffers(ROAD, 2, 64, 48)
    with pytest.raises(Exception, match=f"expected {PACKED.size} uint8 bytes"): s.send(ROAD, bytes(10), 0)
    with pytest.raises(Exception, match="no buffers for stream 1"): s.send(DRIVER, bytes(10), 0)

def test_a_silent_handshake_blocks_neither_send_nor_connected_clients(name):
  with VisionIpcServer(name) as s:
    s.create_buffers(ROAD, 2, 64, 48)
    s.start_listener()
    c = VisionIpcClient(name, ROAD, False)
    assert c.connect(True)
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as silent:
      silent.connect(s.path)   # occupies the listener until its handshake times out
      s.send(ROAD, frame_bytes(PACKED, 4), 4)
      assert c.recv(2000).frame_id == 4
      assert VisionIpcClient(name, ROAD, False).connect(False)   # served while the silent one waits
    c.close()

def test_garbage_on_the_handshake_socket_silent_and_deaf_clients_affect_nobody(name):
  """Garbage, truncated requests and requests for a stream it lacks get no reply (openpilot's server closes them);
  clients that connect and say nothing, or ask and never read the reply, or subscribe and never read a frame, hold up
  neither the server nor a client that connects meanwhile (one non-blocking try: a single handshake with its 2 s
  timeout) nor one that reads every frame."""
  with VisionIpcServer(name) as s:
    s.create_buffers(ROAD, 4, 64, 48)
    s.start_listener()
    good, lazy = VisionIpcClient(name, ROAD, False), VisionIpcClient(name, ROAD, False)
    assert good.connect(True) and lazy.connect(True)   # lazy never calls recv()
    req = REQUEST.pack(ROAD)
    junk = [b"x", req[:-1], req + b"\0", REQUEST.pack(DRIVER), os.urandom(64), os.urandom(4096)]
    for j in junk:
      with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as c:
        c.settimeout(5)
        c.connect(s.path)
        c.send(j)
        assert c.recv(65536) == b"", j   # closed, no reply
    held = []
    for i in range(20):
      held.append(c := socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET))
      c.connect(s.path)
      if i % 2: c.send(req)   # asks, never reads (the reply carries the buffers' fd)
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as c:
      c.connect(s.path)   # truncated: gone before its request
    late = VisionIpcClient(name, ROAD, False)
    assert late.connect(False), "a client connecting next to silent ones was not served"
    n, got = 3000, []   # far more than lazy's queue holds (zmq: 768 packets; shm: lazy is lapped): sending never blocks on it
    for f in range(n):
      s.send(ROAD, frame_bytes(PACKED, f), f)
      if (b := good.recv(2000)) is not None: got.append(b.frame_id)
    assert got == list(range(n)) and late.recv(2000).frame_id == 0
    for c in held: c.close()
    assert VisionIpcClient.available_streams(name, False) == {ROAD}
    for c in (good, lazy, late): c.close()

def test_a_client_kept_across_a_restart_misses_no_frame_of_the_new_server(name):
  """The new server's first frame reaches a client still connected to the old one: the frame shows the restart, the
  client reconnects, and the next recv() returns that very frame from the new buffers (a lockstep camera sends it once)."""
  a = Server(name)
  a("create", ROAD, 2, str(PACKED)); a("listen")
  c = VisionIpcClient(name, ROAD, False)
  assert c.connect(True)
  a_id = c.server_id
  a.close()
  b = Server(name)
  try:
    b("create", ROAD, 3, str(PADDED)); b("listen")
    deadline = time.monotonic() + 5
    while not b("readers", ROAD)[0] and time.monotonic() < deadline: assert c.recv(20) is None
    b("send", ROAD, [7, 8])
    assert c.recv(2000) is None and not c.is_connected() and c.reconnects == 1   # frame 7 named another server
    assert c.connect(True) and c.server_id != a_id and c.layout == PADDED
    got = [c.recv(2000) for _ in range(2)]
    assert [g.frame_id for g in got] == [7, 8] and all((g.array == frame_bytes(g.layout, g.frame_id)).all() for g in got)
    del got
  finally:
    c.close()
    b.close()
