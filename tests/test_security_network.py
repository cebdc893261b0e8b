"""Network peers (MSGQ_TCP, camerad's bridge), with real processes and real TCP: a subscription flood stores nothing in
the publisher, connections per endpoint are capped and a peer's cost goes with it, a remote publisher's oversize
message is refused before it is read and the connection comes back, and what peers make us log is rate-limited."""
import logging, multiprocessing, os, re, signal, socket, threading, time
from contextlib import contextmanager
import pytest
import zmq
import msgq
from msgq.tcp import GREETING, PEERS
from msgq.zmq import SubSocket
from msgq.visionipc import ROAD, VisionIpcClient
from tests import test_bridge
from tests.test_bridge import camerad, device, served_ids
addr, procs = test_bridge.addr, test_bridge.procs   # its fixtures: a loopback address of the test's own, the processes started

CTX = multiprocessing.get_context("spawn")
MiB = 1024 * 1024
SMALL = 250 * 1024   # most services' segment: messages up to 85,320 bytes
FLOOD = 20_000       # distinct 64-byte topics a hostile peer subscribes to

@pytest.fixture(params=["zmq", "shm"])
def transport(request, monkeypatch):
  monkeypatch.setenv("MSGQ_TRANSPORT", request.param)
  monkeypatch.setenv("MSGQ_TCP", "1")   # before a child starts: it inherits the environment
  return request.param

def rss(pid: int) -> int:
  with open(f"/proc/{pid}/status") as f: return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))

@contextmanager
def steady(pub: msgq.PubSocket):
  """pub sends message i (8 bytes, little-endian) every 2 ms from a thread meanwhile."""
  stop = threading.Event()
  def run() -> None:
    i = 0
    while not stop.wait(0.002):
      pub.send(i.to_bytes(8, "little"))
      i += 1
  (t := threading.Thread(target=run, daemon=True)).start()
  try: yield
  finally:
    stop.set()
    t.join()

def _steady_publisher(conn) -> None:
  """Publishes "ep" steadily (steady()); answers "readers" with its TCP readers."""
  pub = msgq.pub_sock("ep", SMALL)
  with steady(pub):
    conn.send("up")
    while (cmd := conn.recv()) is not None:
      tcp = pub._s if pub._s.transport == "zmq" else pub._s.tcp
      if cmd == "readers": conn.send(tcp.readers)

@contextmanager
def child(target, *args):
  parent_end, child_end = CTX.Pipe()
  p = CTX.Process(target=target, args=(*args, child_end), daemon=True)
  p.start()
  try:
    assert parent_end.poll(30), "child did not start"
    assert parent_end.recv() == "up"
    yield p, parent_end
  finally:
    if p.is_alive(): os.kill(p.pid, signal.SIGKILL)
    p.join(5)

def ask(conn, cmd):
  conn.send(cmd)
  assert conn.poll(10), f"no reply to {cmd}"
  return conn.recv()

def wait_until(cond, what: str, timeout: float = 20) -> None:
  deadline = time.monotonic() + timeout
  while not cond():
    assert time.monotonic() < deadline, f"not within {timeout} s: {what}"
    time.sleep(0.02)

def zmtp_frame(body: bytes, command: bool = False) -> bytes:
  flags = 4 if command else 0
  return (bytes((flags, len(body))) if len(body) < 256 else bytes((flags | 2,)) + len(body).to_bytes(8, "big")) + body

SUB_READY = zmtp_frame(b"\x05READY\x0bSocket-Type" + (3).to_bytes(4, "big") + b"SUB", command=True)

def hostile_subscriber(port: int, topics: list[bytes]) -> str:
  """A ZMTP 3 SUB of raw bytes: once greeted, subscribes to `topics` in order, then to everything, and reads until the
  first message ('served': every subscription before it was applied) or the end of the connection ('closed')."""
  s = socket.create_connection(("127.0.0.1", port), timeout=60)
  buf = b""
  def more() -> bool:
    nonlocal buf
    try: got = s.recv(65536)
    except ConnectionResetError: got = b""
    buf += got
    return bool(got)
  try:
    s.sendall(GREETING)
    while len(buf) < 64:
      if not more(): return "closed"
    try: s.sendall(SUB_READY + b"".join(zmtp_frame(b"\x01" + t) for t in topics) + zmtp_frame(b"\x01"))
    except (BrokenPipeError, ConnectionResetError): return "closed"
    while True:
      while len(buf) >= 64 + 2:
        if not buf[64] & 4: return "served"   # a message (ours are short)
        buf = buf[:64] + buf[66 + buf[65]:]   # a command (READY): skipped
      if not more(): return "closed"
  finally: s.close()

def test_a_subscription_flood_over_tcp_stores_nothing_and_every_message_still_arrives(transport):
  """20,000 subscriptions to distinct 64-byte topics from one TCP peer: the publisher stores none (its resident memory
  barely moves; libzmq's PUB and XPUB kept each in a trie, 80-160 MB here), the peer is closed, its subscriber count is
  back once it left, and a plain ZMQ SUB (openpilot's bridge) gets every message meanwhile."""
  with child(_steady_publisher) as (p, conn):
    port = msgq.tcp_port("ep")
    legit = zmq.Context.instance().socket(zmq.SUB)
    legit.setsockopt(zmq.LINGER, 0)
    legit.setsockopt(zmq.RCVTIMEO, 5000)
    legit.setsockopt(zmq.SUBSCRIBE, b"")
    legit.connect(f"tcp://127.0.0.1:{port}")
    got = [int.from_bytes(legit.recv(), "little") for _ in range(50)]
    before = rss(p.pid)
    topics = [os.urandom(32).hex().encode() for _ in range(FLOOD)]
    assert hostile_subscriber(port, topics) == "closed"
    grown = rss(p.pid) - before
    got += [int.from_bytes(legit.recv(), "little") for _ in range(200)]
    assert ask(conn, "readers") == 1   # the flooder never counted (or no longer does)
    legit.close(0)
    wait_until(lambda: ask(conn, "readers") == 0, "the plain SUB's leaving counted")
  assert got == list(range(got[0], got[0] + len(got))), "the plain SUB lost messages during the flood"
  assert grown < 16 * MiB, f"the publisher grew {grown / MiB:.0f} MiB under {FLOOD} subscriptions"

def test_only_the_empty_subscription_is_served_over_tcp(transport):
  """A ZMQ SUB with a topic is closed (and named in a warning), as is one sending far more than a subscriber does
  (each frame is judged by the publisher, holding the GIL); one subscribed to everything stays."""
  with child(_steady_publisher) as (_, conn):
    port = msgq.tcp_port("ep")
    assert hostile_subscriber(port, [b"\x08"]) == "closed"   # a prefix of capnp's first byte: would match every message
    assert hostile_subscriber(port, [b""] * 10_000) == "closed"   # valid, but 10,000 times
    assert hostile_subscriber(port, []) == "served"

def test_tcp_connections_per_endpoint_are_capped_and_a_peers_cost_goes_with_it(monkeypatch, caplog):
  """PEERS subscribers are served; one more connection is closed before a byte is sent to it, and is served once one
  left. What the publisher counts of its peers is back to nothing when they are gone; the warnings stay few."""
  monkeypatch.setenv("MSGQ_TCP", "1")
  caplog.set_level(logging.WARNING, "msgq.tcp")
  pub = msgq.pub_sock("ep")
  port = msgq.tcp_port("ep")
  subs = []
  for _ in range(PEERS):
    s = zmq.Context.instance().socket(zmq.SUB)
    s.setsockopt(zmq.LINGER, 0)
    s.setsockopt(zmq.SUBSCRIBE, b"")
    s.connect(f"tcp://127.0.0.1:{port}")
    subs.append(s)
  wait_until(lambda: pub._s.readers == PEERS, f"{PEERS} subscribers")
  for _ in range(3 * PEERS):   # over the cap: closed at once, nothing sent
    with socket.create_connection(("127.0.0.1", port), timeout=10) as over:
      assert over.recv(64) == b"", "a connection over the cap was answered"
  assert len([r for r in caplog.records if r.name == "msgq.tcp"]) <= 10, "peers' warnings were not rate-limited"
  subs.pop().close(0)
  wait_until(lambda: pub._s.readers == PEERS - 1, "a subscriber's leaving counted")
  with steady(pub): assert hostile_subscriber(port, []) == "served"   # a place is free again
  for s in subs: s.close(0)
  wait_until(lambda: pub._s.readers == 0 and not pub._s._st.tcp.peers, "every peer's leaving counted")
  pub.close()

def _hostile_publisher(port: int, sizes: list[int], conn) -> None:
  """A plain ZMQ PUB on `port` (a hostile device) sending b'ok0' every 10 ms; at command i, a message of each size
  (b'x' * n), then b'ok<i>' every 10 ms."""
  pub = zmq.Context.instance().socket(zmq.PUB)
  pub.setsockopt(zmq.LINGER, 0)
  pub.setsockopt(zmq.SNDHWM, 100_000)
  pub.bind(f"tcp://127.0.0.1:{port}")
  conn.send("up")
  ok = b"ok0"
  while True:
    while not conn.poll(0.01): pub.send(ok)
    if (i := conn.recv()) is None: return
    for n in sizes: pub.send(b"x" * n)
    ok = b"ok%d" % i

def free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]

def test_a_remote_publishers_oversize_messages_are_refused_unread_and_the_connection_comes_back(caplog):
  """A device sending bursts of messages twice what the endpoint takes: libzmq refuses a burst's first as it reads its
  size (MAXMSGSIZE), so none of their bytes is taken (they were each read whole and refused after), connects again
  and reads on; the warnings stay few."""
  caplog.set_level(logging.WARNING, "msgq")
  max_size, port = msgq.max_message(SMALL), free_port()
  with child(_hostile_publisher, port, [2 * max_size] * 300) as (_, conn):
    sub = SubSocket("ep", "127.0.0.1", False, SMALL, port=port)   # as camerad's bridge subscribes to a device
    sub.timeout = 100
    wait_until(lambda: sub.receive() == b"ok0", "the first message", 30)
    for i in range(1, 11):
      conn.send(i)
      wait_until(lambda i=i: sub.receive() == b"ok%d" % i, "a message after the oversize ones", 30)
    conn.send(None)
  assert sub.refused == 10, f"{sub.refused} refusals of 10 bursts of 300: the oversize messages were read"
  sub.close()
  assert len([r for r in caplog.records if r.name == "msgq"]) <= 10, "a remote publisher's warnings were not rate-limited"

def _hostile_device(host: str, conn) -> None:
  """The wide camera of a hostile device: on its bridge port, every 20 ms a malformed message and a keyframe that
  declares 8192x8192 (camerad made its buffers to the size a device declares)."""
  from cereal import messaging
  from oproute.video import KEYFRAME_FLAG
  pub = zmq.Context.instance().socket(zmq.PUB)
  pub.setsockopt(zmq.LINGER, 0)
  pub.bind(f"tcp://{host}:{msgq.tcp_port('wideRoadEncodeData', '')}")
  ev = messaging.new_message("wideRoadEncodeData")
  ed = ev.wideRoadEncodeData
  ed.width, ed.height, ed.idx.flags, ed.data, ed.header = 8192, 8192, KEYFRAME_FLAG, bytes(1000), bytes(100)
  giant = ev.to_bytes()
  conn.send("up")
  while not conn.poll(0.02):
    pub.send(os.urandom(64))
    pub.send(giant)

def test_a_hostile_device_is_refused_by_name_and_camerad_serves_on(scene, addr, procs):
  """Beside a device's good road camera, its wide camera sends garbage and a frame size of 8192x8192: camerad serves
  the road camera, makes no buffers for the wide one, and names both refusals when it stops."""
  device(procs, scene, addr, "--cameras", "road")
  with child(_hostile_device, addr) as (_, conn):
    cam = camerad(procs, addr)
    assert served_ids(2)
    assert VisionIpcClient.available_streams("camerad", False) == {ROAD}
    assert cam.stop() == 0 and cam.proc.returncode == 0
    conn.send(None)
  out = cam.output()
  assert re.search(r"skipped \d+: wide: malformed wideRoadEncodeData messages", out), out
  assert re.search(r"skipped \d+: wide: frames of a size that is no camera's \(at most 4096x4096, even\)", out), out
