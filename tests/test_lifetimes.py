"""Object lifetimes as openpilot's own msgq and VisionIPC tests use them: created and dropped test after test in one
process. Each object frees its endpoint, name, sockets, threads and mappings the moment its last reference goes (the
cyclic garbage collector is off: reference counting alone must do it), at close(), or at the end of a `with` block."""
import gc, os, time, weakref
import numpy as np
import pytest
import msgq
from msgq.visionipc import VisionIpcServer, VisionIpcClient, ROAD

CYCLES = 1000
SETTLE_S = 5   # libzmq closes a socket's own file descriptors on its reaper thread, just after close() returns

def usage() -> tuple[int, int]:
  """(open file descriptors, threads) of this process, ZMQ's native threads included."""
  return len(os.listdir("/proc/self/fd")), len(os.listdir("/proc/self/task"))

def settled(start: tuple[int, int]) -> tuple[int, int]:
  """usage() once neither count is above `start` (a thread of an earlier test may end meanwhile), or as it is after
  SETTLE_S."""
  deadline = time.monotonic() + SETTLE_S
  while not below(now := usage(), start) and time.monotonic() < deadline: time.sleep(0.01)
  return now

def below(now: tuple[int, int], start: tuple[int, int]) -> bool: return all(n <= s for n, s in zip(now, start))

def leaked(start: tuple[int, int]) -> bool: return not below(settled(start), start)

def maps(name: str) -> int:
  """Mappings of memfds named `name`..., or of files whose path starts with `name`."""
  with open("/proc/self/maps") as f: return f.read().count(name if name.startswith("/") else f"memfd:{name}")

@pytest.fixture
def no_gc():
  gc.collect()
  gc.disable()
  yield
  gc.enable()

def _pub():
  return msgq.pub_sock("ep")   # the same endpoint every time: a publisher still alive would make this raise

def _sub():
  return msgq.sub_sock("ep")

def _poller():
  p = msgq.Poller()
  msgq.sub_sock("ep", poller=p)   # the poller holds it: both go together
  return p

def _server():
  s = VisionIpcServer("camerad")   # the same name every time: "already running" if the last one were alive
  s.create_buffers(ROAD, 2, 64, 48)
  s.start_listener()
  return s

@pytest.fixture(params=["zmq", "shm"])
def transport(request, monkeypatch):
  monkeypatch.setenv("MSGQ_TRANSPORT", request.param)

@pytest.mark.parametrize("make", [_pub, _sub, _poller, _server], ids=["PubSocket", "SubSocket", "Poller", "VisionIpcServer"])
def test_dropped_objects_free_everything(make, no_gc, transport):
  keep = msgq.pub_sock("other")   # ZMQ's context and threads exist before the count starts
  start = usage()
  for _ in range(CYCLES):
    obj = make()
    del obj
  assert not leaked(start), f"(fds, threads) after {CYCLES} objects created and dropped: {usage()}, at start {start}"
  assert maps("visionipc_") == 0 and maps("/dev/shm/msgq_") <= 1   # the one kept, on shm
  keep.close()

def test_dropped_clients_free_everything(no_gc, transport):
  """A client connected to a live server and holding a frame: dropped, it unmaps the buffers and closes its socket."""
  with VisionIpcServer("camerad") as srv:
    srv.create_buffers(ROAD, 2, 64, 48)
    srv.start_listener()
    srv.send(ROAD, np.zeros(64 * 48 * 3 // 2, np.uint8), 0)   # its publisher's first message binds the listener of its size class
    assert VisionIpcClient("camerad", ROAD).connect(True)   # the listener's thread is up, with its selector's fd
    start, mapped = usage(), maps("visionipc_camerad_0")
    for i in range(CYCLES):
      c = VisionIpcClient("camerad", ROAD, conflate=True)
      assert c.connect(True)
      srv.send(ROAD, np.full(64 * 48 * 3 // 2, i % 256, np.uint8), i)
      assert (buf := c.recv(2000)) is not None and buf.frame_id == i and buf.array[0] == i % 256
      del c, buf
    assert not leaked(start) and maps("visionipc_camerad_0") == mapped, (usage(), start)
    deadline = time.monotonic() + SETTLE_S   # the last unsubscription reaches the server's publisher a moment later
    while srv.has_readers(ROAD) and time.monotonic() < deadline: time.sleep(0.01)
    assert srv.has_readers(ROAD) is False   # every subscription went with its client

def test_a_publisher_is_gone_the_moment_it_is_dropped_even_while_its_pump_works(no_gc):
  """Subscribers come and go, so the pump thread is busy applying subscriptions when the publisher is dropped: the
  thread must not be what holds it (the endpoint would stay taken until the thread lets go)."""
  subs = []
  for i in range(CYCLES):
    pub = msgq.pub_sock("ep")
    subs.append(msgq.zmq.SubSocket("ep", "127.0.0.1", False, 0, wait=0))   # its subscription reaches the pump about now
    ref = weakref.ref(pub)
    del pub
    assert ref() is None, f"publisher {i} still alive after its last reference went"
    if len(subs) > 8: subs.pop(0).close()
  for s in subs: s.close()

def test_close_and_with_free_at_once_while_references_remain():
  srv_ref, pub_ref = None, None
  with VisionIpcServer("camerad") as srv, msgq.pub_sock("ep") as pub, msgq.sub_sock("ep") as sub, msgq.Poller() as poller:
    srv.create_buffers(ROAD, 2, 64, 48)
    srv.start_listener()
    poller.registerSocket(sub)
    with VisionIpcClient("camerad", ROAD) as c: assert c.connect(True)
    assert not c.is_connected() and c._sock is None   # closed at the end of its block
    srv_ref, pub_ref = srv, pub
  assert poller.sockets == []
  with pytest.raises(msgq.IpcError, match="closed subscriber"): sub.receive()
  VisionIpcServer("camerad").close()   # the name is free although srv is still referenced
  srv_ref.close(); pub_ref.close()     # idempotent
  with pytest.raises(msgq.IpcError, match="closed publisher"): pub_ref.send(b"x")
