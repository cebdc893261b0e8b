"""The shm transport: openpilot's sockets (impl_msgq.cc) over its shared-memory queues (shmq.py), so openpilot's own
processes publish to and subscribe from ours. With MSGQ_TCP, a publisher also serves remote subscribers over TCP."""
import time
from msgq import shmq
from msgq.pubsub import IpcError, MultiplePublishersError, prefix

log = shmq.log   # rate-limited: what a queue file holds is written by its every opener

def _queue(endpoint: str, segment_size: int) -> shmq.Queue:
  try: return shmq.Queue(endpoint, prefix(), segment_size)
  except shmq.QueueError as e: raise IpcError(str(e)) from None

class PubSocket:
  transport, q, tcp = "shm", None, None   # q and tcp until made: close() (from __del__) needs them

  def __init__(self, endpoint: str, segment_size: int):
    from msgq.tcp import tcp_publisher
    self.endpoint, self.q, self.superseded = endpoint, _queue(endpoint, segment_size), False
    self.q.init_publisher()
    self.tcp = tcp_publisher(endpoint, segment_size)   # None unless MSGQ_TCP asks for it

  def send(self, data) -> int:
    if not isinstance(data, (bytes, bytearray)): data = memoryview(data).cast("B")   # len() counts bytes
    if (q := self.q) is None or not q.send(data): self._lost()
    if self.tcp is not None: self.tcp.send(data)
    return len(data)

  def _lost(self) -> None:
    """Closed, or a newer publisher took the endpoint: let go of it (once) and say which."""
    if self.q is not None: self.superseded, self.path = True, self.q.path; self.close()
    if self.superseded: raise MultiplePublishersError(f"{self.endpoint}: a newer publisher took the endpoint ({self.path})")
    raise IpcError(f"send on closed publisher {self.endpoint!r}")

  def taken_over(self) -> bool: return self.superseded or (self.q is not None and not self.q.is_publisher())
  def all_readers_updated(self) -> bool: return self.q is not None and self.q.all_readers_updated()
  def reader_pids(self) -> set[int]: return set() if self.q is None else self.q.reader_pids()

  def close(self) -> None:
    if self.q is not None: self.q.close(); self.q = None
    if self.tcp is not None: self.tcp.close(); self.tcp = None

  def __del__(self): self.close()

class SubSocket:
  transport, q = "shm", None

  def __init__(self, endpoint: str, address: str | None, conflate: bool, segment_size: int):
    self.endpoint, self.timeout, self.errors = endpoint, None, 0
    self.q = _queue(endpoint, segment_size)
    self.q.conflate = conflate
    self.q.init_subscriber()

  def _recv(self) -> bytes | None:
    """One try. A broken record is logged (the file named) and skipped: the queue reads on from its newest message."""
    try: return self.q.recv()
    except (AttributeError, shmq.QueueError) as e: return self._failed(e)

  def _failed(self, e: Exception) -> None:
    if self.q is None: raise IpcError(f"receive on closed subscriber {self.endpoint!r}") from None
    if not isinstance(e, shmq.QueueError): raise e
    self.errors += 1
    log.warning("%s (%d so far)", e, self.errors)

  def receive(self, non_blocking: bool = False) -> bytes | None:
    try: msg = self.q.recv()   # _recv() inlined: this is what a poll's wake-up runs
    except (AttributeError, shmq.QueueError) as e: msg = self._failed(e)
    if msg is not None or non_blocking: return msg
    deadline = None if self.timeout is None else time.monotonic() + self.timeout / 1000
    while True:
      left = None if deadline is None else deadline - time.monotonic()
      if left is not None and left <= 0: return None
      shmq.wait([self.q], left)
      if (msg := self._recv()) is not None: return msg

  def close(self) -> None:
    if self.q is not None: self.q.close(); self.q = None

  def __del__(self): self.close()

class Poller:
  """Polls the queues of registered sockets; returns what was registered with each (the facade sockets)."""
  transport = "shm"

  def __init__(self): self.socks, self.queues, self.owners = [], [], []
  def register(self, s: SubSocket, owner) -> None: self.socks.append(s); self.queues.append(s.q); self.owners.append(owner)

  def poll(self, timeout: int) -> list:
    if any(q is not s.q for q, s in zip(self.queues, self.socks)):   # a socket closed since: left out
      keep = [i for i, s in enumerate(self.socks) if s.q is not None]
      self.socks, self.queues, self.owners = ([xs[i] for i in keep] for xs in (self.socks, self.queues, self.owners))
    return [self.owners[i] for i in shmq.wait(self.queues, None if timeout < 0 else timeout / 1000)]
