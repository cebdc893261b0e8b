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
  source waits for the daemon's clients before its first frame); and, while frames come, a stream that makes
  `wanted` choose otherwise (a live source's camera that started late: the wide road camera joining the road one)."""
  CHECK_S = 1.

  def __init__(self, server: str, streams: set[int], server_id: int | None, wanted: Callable[[set[int]], object]):
    self.server, self.seen, self.wanted = server, (server_id, streams), wanted
    self.last = self.checked = time.monotonic()

  def frame(self) -> None: self.last = time.monotonic()

  def changed(self) -> bool:
    """Call at every frame and receive timeout: True (reconnect) if the server differs now. Frames stopped over
    CHECK_S ago: its id and streams are asked; frames coming: its stream list, every CHECK_S."""
    from msgq.visionipc import VisionIpcClient
    if (now := time.monotonic()) - self.checked < self.CHECK_S: return False
    self.checked = now
    if now - self.last < self.CHECK_S:
      if (have := VisionIpcClient.available_streams(self.server, False)) and self.wanted(have) != self.wanted(self.seen[1]):
        log.warning("camera server %r now serves streams %s (was %s): reconnecting", self.server, sorted(have), sorted(self.seen[1]))
        return True
      return False
    self.last = now
    if (info := VisionIpcClient.server_info(self.server) or (None, set())) == self.seen: return False
    log.warning("camera server %r now serves streams %s (was %s)%s", self.server, sorted(info[1]), sorted(self.seen[1]),
                ", restarted" if info[0] not in (None, self.seen[0]) else "")
    return True
