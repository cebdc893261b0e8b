"""Camera-client start-up both daemons share: wait for the camera server's streams, connect, while staying stoppable."""
from __future__ import annotations
import logging, time
from collections.abc import Callable
from service import StopFlag

log = logging.getLogger(__name__)
POLL_S = 0.1   # openpilot polls available streams every 0.1 s

def wait_for_streams(server: str, stop: StopFlag, tick: Callable[[], None]) -> set[int] | None:
  """The streams `server` serves, polled every POLL_S until it has some; None if stop was set meanwhile."""
  from msgq.visionipc.wire import socket_path
  from msgq.visionipc import VisionIpcClient
  logged = False
  while not stop:
    if streams := VisionIpcClient.available_streams(server, False): return streams
    # where it looks: a camerad of another OPENPILOT_PREFIX, transport or runtime directory is never found
    if not logged: log.info("waiting for camera server %r (at %s)", server, socket_path(server))
    logged = True
    tick()
    time.sleep(POLL_S)
  return None

def connect(clients: list, stop: StopFlag, tick: Callable[[], None], timeout: float = 10.) -> bool:
  """Connect every client (non-blocking tries every POLL_S). False if stopped, or a stream vanished for `timeout` s."""
  t0 = time.monotonic()
  for c in clients:
    while not c.connect(False):
      if stop or time.monotonic() - t0 > timeout: return False
      tick()
      time.sleep(POLL_S)
  return True

class StreamWatch:
  """Notices a camera server that went away, restarted, or came back with another set of streams while no frame
  arrives (a client only sees a restart in a frame of the new server, and an idle client gets none: a lockstep camera
  source waits for the daemon's clients before its first frame)."""
  CHECK_S = 1.

  def __init__(self, server: str, streams: set[int], server_id: int | None):
    self.server, self.seen, self.last = server, (server_id, streams), time.monotonic()

  def frame(self) -> None: self.last = time.monotonic()

  def changed(self) -> bool:
    """Call when a receive timed out: True (reconnect) if frames stopped over CHECK_S ago and the server differs now."""
    from msgq.visionipc import VisionIpcClient
    if time.monotonic() - self.last < self.CHECK_S: return False
    self.last = time.monotonic()
    if (now := VisionIpcClient.server_info(self.server) or (None, set())) == self.seen: return False
    log.warning("camera server %r now serves streams %s (was %s)%s", self.server, sorted(now[1]), sorted(self.seen[1]),
                ", restarted" if now[0] not in (None, self.seen[0]) else "")
    return True
