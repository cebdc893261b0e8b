"""--lockstep: camerad sends a frame only once the daemons answered the one before."""
from __future__ import annotations
import logging, time
from cereal import messaging
from service import StopFlag
from cereal.services import ANSWERS, CAMERA_OF_STREAM as CAMERA_OF, CAMERA_STATE_SERVICES, answer_streams, road_streams
from msgq.zmq import RECONNECT_IVL_MAX_S
from msgq.visionipc import VisionIpcServer
from camerad.sources import OptionError

log = logging.getLogger("camerad")

class LockstepTimeout(Exception): pass

# messages and frames travel on separate sockets: in lockstep, the messages that come before a frame get this long to be
# taken in by the daemons (idle, waiting for that frame) before the frame goes out, so they apply to it and not later
LOCKSTEP_SETTLE_S = 0.005
LOCKSTEP_FIRST_SETTLE_S = 0.1   # the first frame's (a log's calibration, republished): on a loaded machine 5 ms can be short
# before frame 1: subscribers made before camerad's publishers connect within msgq's reconnect interval, and a daemon
# takes its subscriptions live when it next polls (every 0.1 s while idle); at most LOCKSTEP_READERS_S for a reader each
LOCKSTEP_CONNECT_S = RECONNECT_IVL_MAX_S + 0.2
LOCKSTEP_READERS_S = 2.
LOCKSTEP_STATE_S = 10.   # for a process with a camera client to read that camera's state (a daemon's warm-up)

class Lockstep:
  """Waits for the daemons' outputs (frameId == the frame just sent) before the next frame is sent."""
  def __init__(self, services: list[str] | None, streams, timeout: float, stop: StopFlag, idle=lambda: None):
    self.timeout, self.stop, self.idle, self.socks = timeout, stop, idle, {}
    self.expect = answer_streams(services or ANSWERS, streams)   # any service not dmonitoringd's answers a road frame
    if not self.expect: raise OptionError("--lockstep: the source serves no camera stream, nothing to wait for")
    # the daemons waited for: modeld takes every road stream (its frames go in pairs), dmonitoringd the driver's; a
    # stream no awaited answer comes from (the driver's with --lockstep-services modelV2) is served without waiting
    road = set(road_streams(streams) or ())
    self.clients = [s for s in streams if s in self.expect.values() or (s in road and road & set(self.expect.values()))]

  def answers(self, streams) -> dict[str, int]:
    """What answers a frame of these streams (of those served), and the stream whose frame id it carries: modeld's
    modelV2 the main camera's frame, dmonitoringd's driverStateV2 the driver's (or the --lockstep-services given)."""
    return {s: stream for s, stream in self.expect.items() if stream in streams}

  def wait_for_clients(self, server: VisionIpcServer, pm, since: float) -> None:
    """Before the first frame: a frame sent before a daemon's client subscribed would never be answered, and messages
    sent before its subscriptions reach camerad's publishers (up since `since`) would be lost (a log's calibration,
    say). Publishers no daemon subscribes to within LOCKSTEP_READERS_S are not waited for."""
    deadline = time.monotonic() + self.timeout
    while not self.stop and not all(server.has_readers(s) for s in self.clients):
      if time.monotonic() > deadline:
        missing = [CAMERA_OF[s] for s in self.clients if not server.has_readers(s)]
        raise LockstepTimeout(f"--lockstep: no VisionIPC client for {', '.join(missing)} within {self.timeout:g} s: is the daemon running?")
      self.idle()
      time.sleep(0.01)
    # the daemons subscribe once they can take a frame (models warmed up, after their camera clients), their camera's
    # state after every other input: each process with a client on a stream reading that stream's state is that (any
    # reader would not do: a recorder's came first). A client's process that takes none (another program's) is waited
    # for LOCKSTEP_STATE_S from when its client came
    seen, waiting = {}, {}   # a client's process -> when it was first seen with a client; those not subscribed yet
    while not self.stop and time.monotonic() < deadline:
      now, waiting = time.monotonic(), self.unsubscribed(server, pm)
      for pid in waiting: seen.setdefault(pid, now)
      if all(now - seen[pid] >= LOCKSTEP_STATE_S for pid in waiting): break
      self.idle()
      time.sleep(0.01)
    for pid, s in waiting.items():
      if not self.stop: log.warning("--lockstep: process %d holds a %s client, does not read %s: not waited for", pid, CAMERA_OF[s], CAMERA_STATE_SERVICES[s])
    readers_deadline = time.monotonic() + LOCKSTEP_READERS_S
    while not self.stop and (time.monotonic() < since + LOCKSTEP_CONNECT_S or
                             (time.monotonic() < readers_deadline and not all(pm.all_readers_updated(s) for s in pm.sock))):
      self.idle()
      time.sleep(0.01)
    # subscribe now: a daemon's publisher is normally up once its camera client is, and a subscription to a running
    # publisher is live when sub_sock returns, so the answer to the first frame cannot slip by while connecting
    self.socks = {s: messaging.sub_sock(s, timeout=100) for s in self.expect}   # not conflated: no answer is missed

  def unsubscribed(self, server: VisionIpcServer, pm) -> dict[int, int]:
    """The processes with a client on a waited-for stream that do not read its camera state yet -> the stream."""
    return {pid: s for s in self.clients for pid in server.reader_pids(s) - pm.sock[CAMERA_STATE_SERVICES[s]].reader_pids()}

  def wait(self, frame_ids: dict[int, int]) -> None:
    """frame_ids: the frame just sent on each stream."""
    deadline = time.monotonic() + self.timeout
    for svc, stream in self.answers(frame_ids).items():
      frame_id = frame_ids[stream]
      while not self.stop:
        self.idle()   # a slow daemon is not a hung camerad: keep the service manager's watchdog fed
        if (dat := self.socks[svc].receive()) is not None:
          # an event of another service on this topic is skipped too: reading it as this one would raise
          try: ev = messaging.log_from_bytes(dat, expect=svc)
          except messaging.MalformedMessageError as e: log.warning("lockstep: malformed %s ignored: %s", svc, e)
          else:
            if getattr(ev, svc).frameId == frame_id: break
        if time.monotonic() > deadline:
          raise LockstepTimeout(f"--lockstep: no {svc} for frame {frame_id} within {self.timeout:g} s: is the daemon running?")

  def close(self) -> None:
    for s in self.socks.values(): s.close()
