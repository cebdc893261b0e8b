"""cereal.messaging: Cap'n Proto `Event`s over msgq, with openpilot's PubMaster/SubMaster API."""
import functools, logging, time
from collections import deque
import capnp

from cereal import log
from cereal.services import SERVICES
from msgq import (IpcError, MultiplePublishersError, Poller, PubSocket, SubSocket, drain_sock_raw,
                  pub_sock as _pub_sock, sub_sock as _sub_sock)

logger = logging.getLogger("cereal.messaging")

__all__ = ["log", "new_message", "log_from_bytes", "pub_sock", "sub_sock", "drain_sock", "drain_sock_raw", "recv_one",
           "recv_one_or_none", "recv_one_retry", "PubMaster", "SubMaster", "Poller", "PubSocket", "SubSocket", "IpcError",
           "MultiplePublishersError", "MalformedMessageError", "UnknownMemberError"]

class MalformedMessageError(ValueError): pass
class UnknownMemberError(MalformedMessageError):
  """A well-formed event of a union member this schema does not know (a newer openpilot's)."""
  def __init__(self, msg: str, log_mono_time: int, valid: bool):
    super().__init__(msg)
    self.logMonoTime, self.valid = log_mono_time, valid

def _segment_size(endpoint: str) -> int:
  """As openpilot's: the service's queue size; 0 (msgq's default) for an endpoint outside the table."""
  return SERVICES[endpoint].queue_size if endpoint in SERVICES else 0

def new_message(service: str | None = None, size: int | None = None, **kwargs) -> capnp.lib.capnp._DynamicStructBuilder:
  """A new Event with logMonoTime set; with a service, its union member initialised (size: list length)."""
  msg = log.Event.new_message(**{"logMonoTime": time.monotonic_ns(), "valid": True, **kwargs})
  if service is not None:
    if size is None: msg.init(service)
    else: msg.init(service, size)
  return msg

EVENTS = frozenset(log.Event.schema.union_fields)   # every service name the schema knows: an Event's union members
NESTING_LIMIT = 64             # pointers deep: far beyond any Event, far below what a reader's stack takes
NO_TRAVERSAL_LIMIT = 2 ** 63   # for a message already walked whole under its limit
WALK_SLOT = "sensorEventDEPRECATED"   # an Event member this schema keeps untyped (AnyPointer): takes a whole message

@functools.cache
def _has_union(struct) -> bool: return bool(struct.schema.union_fields)

def log_from_bytes(dat: bytes, struct=log.Event, expect: str | None = None):
  """Parse one message into a reader of its bytes that keeps them alive and stays cheap to read for as long as it is
  kept. Before that the message is walked whole by a reader under a traversal limit proportional to its size: pointers
  out of bounds, too deep, or aliasing the same data to make readers walk far more than it carries are refused here, as
  MalformedMessageError, never later in a consumer. The walk copies the message into an untyped slot of a scratch
  message that is dropped: pycapnp's only whole-message walk that turns a bad pointer into an exception (its
  total_size and as_builder abort the process). The reader returned has no limit of its own: the walk bounded what
  reading the message once costs, and a limit would count every repeated read against it (SubMaster users read the same
  message many times). What this schema does not declare (a newer openpilot's fields) stays in the bytes. An event of
  a union member this schema does not know raises UnknownMemberError, which carries its logMonoTime and valid.
  expect: the service a message on its topic must be; a well-formed event of another is a MalformedMessageError too
  (reading it as the expected one would raise in the consumer)."""
  if not isinstance(dat, bytes): dat = bytes(dat)   # a buffer its owner may change or reuse: the reader keeps a copy
  try:
    if len(dat) % 8: raise ValueError("not a whole number of 8-byte words")
    # read_multiple_bytes: readers that keep their bytes object alive, with no context to close (from_bytes' is one)
    if (msg := next(struct.read_multiple_bytes(dat, 4 * (len(dat) // 8) + 4096, NESTING_LIMIT), None)) is None:
      raise ValueError("no message")
    setattr(log.Event.new_message(num_first_segment_words=len(dat) // 8), WALK_SLOT, msg)
    w = None
    if _has_union(struct):
      try: w = str(msg.which())
      except capnp.KjException:
        raise UnknownMemberError(f"an event of a union member this schema does not know ({len(dat)} bytes)", msg.logMonoTime, msg.valid) from None
    ev = next(struct.read_multiple_bytes(dat, NO_TRAVERSAL_LIMIT, NESTING_LIMIT))
  except UnknownMemberError: raise
  except (capnp.KjException, ValueError, TypeError, AttributeError) as e:
    raise MalformedMessageError(f"malformed message ({len(dat)} bytes): {str(e).splitlines()[0][:200]}") from None
  if expect is not None and w != expect: raise MalformedMessageError(f"expected a {expect} message, got {w}")
  return ev

def pub_sock(endpoint: str) -> PubSocket:
  return _pub_sock(endpoint, _segment_size(endpoint))

def sub_sock(endpoint: str, poller: Poller | None = None, addr: str = "127.0.0.1", conflate: bool = False,
             timeout: int | None = None) -> SubSocket:
  return _sub_sock(endpoint, poller=poller, addr=addr, conflate=conflate, timeout=timeout, segment_size=_segment_size(endpoint))

def drain_sock(sock: SubSocket, wait_for_one: bool = False) -> list:
  return [log_from_bytes(m) for m in drain_sock_raw(sock, wait_for_one)]

def recv_one(sock: SubSocket):
  """Block (up to the socket's timeout) for one message; None on timeout."""
  dat = sock.receive()
  return None if dat is None else log_from_bytes(dat)

def recv_one_or_none(sock: SubSocket):
  dat = sock.receive(non_blocking=True)
  return None if dat is None else log_from_bytes(dat)

def recv_one_retry(sock: SubSocket):
  """Block until a message arrives, whatever the socket's timeout."""
  while (dat := sock.receive()) is None: pass
  return log_from_bytes(dat)

class PubMaster:
  def __init__(self, services: list[str]):
    self.sock = {s: pub_sock(s) for s in services}

  def add(self, s: str) -> None:
    """Publish one more service (the state of a camera that joined a live source)."""
    if s not in self.sock: self.sock[s] = pub_sock(s)

  def send(self, s: str, dat) -> None:
    """dat: an Event builder or its bytes."""
    self.sock[s].send(dat if isinstance(dat, (bytes, bytearray, memoryview)) else dat.to_bytes())

  def wait_for_readers_to_update(self, s: str, timeout: float, dt: float = 0.05) -> bool:
    try: self.sock[s].wait_for_readers(timeout, dt)
    except TimeoutError: return False
    return True

  def all_readers_updated(self, s: str) -> bool:
    return self.sock[s].all_readers_updated()

  def close(self) -> None:
    for sock in self.sock.values(): sock.close()

class SubMaster:
  """The newest message of each service, with openpilot's alive/freq/valid checks from the services table.
  A malformed message (or one of another service) is counted in `malformed`, logged and dropped. addr=None (as
  openpilot's replay uses it): no sockets, fed by update_msgs()."""
  def __init__(self, services: list[str], poll: str | None = None, ignore_alive: list[str] | None = None,
               ignore_avg_freq: list[str] | None = None, ignore_valid: list[str] | None = None, addr: str | None = "127.0.0.1"):
    unknown = [s for s in services if s not in SERVICES]
    if unknown: raise ValueError(f"unknown services {unknown}; known: {sorted(SERVICES)}")
    if poll is not None and poll not in services: raise ValueError(f"poll service {poll!r} is not in {services}")
    self.services, self.frame = list(services), -1
    self.poller = Poller()
    self.non_polled = [s for s in services if poll is not None and s != poll]
    self.sock = {} if addr is None else \
      {s: sub_sock(s, poller=None if s in self.non_polled else self.poller, addr=addr, conflate=True) for s in services}
    self.updated = dict.fromkeys(services, False)
    self.seen = dict.fromkeys(services, False)
    self.alive = dict.fromkeys(services, False)
    self.freq_ok = dict.fromkeys(services, False)
    self.valid = dict.fromkeys(services, True)
    self.recv_time = dict.fromkeys(services, 0.)
    self.recv_frame = dict.fromkeys(services, 0)
    self.logMonoTime = dict.fromkeys(services, 0)
    self.malformed = dict.fromkeys(services, 0)
    self.recv_dts = {s: deque(maxlen=max(10, int(2 * SERVICES[s].frequency))) for s in services}
    self.ignore_alive, self.ignore_avg_freq, self.ignore_valid = set(ignore_alive or []), set(ignore_avg_freq or []), set(ignore_valid or [])
    self.data = {s: getattr(new_message(s).as_reader(), s) for s in services}

  def __getitem__(self, s: str): return self.data[s]

  def _recv(self, s: str):
    dat = self.sock[s].receive(non_blocking=True)
    if dat is None: return None
    try: return log_from_bytes(dat, expect=s)
    except MalformedMessageError as e:
      self.malformed[s] += 1
      logger.warning("dropped malformed message on %s (%d so far): %s", s, self.malformed[s], e)
      return None

  def update(self, timeout: int = 100) -> None:
    """Wait up to timeout ms for a polled service, then take the newest message of every service."""
    if not self.sock: raise RuntimeError("this SubMaster has no sockets (addr=None): feed it with update_msgs()")
    ready = {sock for sock in self.poller.poll(timeout)}
    msgs = [self._recv(s) for s in self.services if self.sock[s] in ready or s in self.non_polled]
    self.update_msgs(time.monotonic(), msgs)

  def update_msgs(self, cur_time: float, msgs: list) -> None:
    self.frame += 1
    self.updated = dict.fromkeys(self.services, False)
    for msg in msgs:
      if msg is None: continue
      s = msg.which()
      self.seen[s] = self.updated[s] = True
      if self.recv_time[s] > 0: self.recv_dts[s].append(cur_time - self.recv_time[s])
      self.recv_time[s], self.recv_frame[s] = cur_time, self.frame
      self.data[s], self.logMonoTime[s], self.valid[s] = getattr(msg, s), msg.logMonoTime, msg.valid
    for s in self.services:
      freq = SERVICES[s].frequency
      self.alive[s] = self.seen[s] and (cur_time - self.recv_time[s]) < 10. / freq
      dts = self.recv_dts[s]
      # average rate over the window, or over its newest tenth: slow to fall, quick to recover
      rates = [len(d) / sum(d) for d in (list(dts), list(dts)[-max(1, len(dts) // 10):]) if d and sum(d) > 0]
      self.freq_ok[s] = any(0.8 * freq <= r <= 1.2 * freq for r in rates)

  def all_alive(self, service_list: list[str] | None = None) -> bool:
    return all(self.alive[s] for s in service_list or self.services if s not in self.ignore_alive)

  def all_freq_ok(self, service_list: list[str] | None = None) -> bool:
    return all(self.freq_ok[s] for s in service_list or self.services if s not in self.ignore_avg_freq)

  def all_valid(self, service_list: list[str] | None = None) -> bool:
    return all(self.valid[s] for s in service_list or self.services if s not in self.ignore_valid)

  def all_checks(self, service_list: list[str] | None = None) -> bool:
    return self.all_alive(service_list) and self.all_freq_ok(service_list) and self.all_valid(service_list)

  def close(self) -> None:
    for sock in self.sock.values(): sock.close()
