"""camerad's bridge source: a comma device's cameras as its encoder publishes them (roadEncodeData, wideRoadEncodeData,
driverEncodeData, HEVC) and openpilot's bridge carries them off the device over TCP, decoded here, one thread per
camera, and served with the device's frame ids and times as soon as they come: never a backlog (a camera behind skips
to its newest keyframe); the device's messages the daemons read are relayed. docs/CAMERAD.md: live from a comma device.
"""
from __future__ import annotations
import logging, queue, threading, time
from collections.abc import Iterator
import av
from cereal import messaging
from cereal.services import CAMERA_OF_STREAM, CAMERA_STATE_SERVICES, CAMERAS, DAEMON_OUTPUTS, DMONITORINGD_INPUTS, MODELD_INPUTS, SERVICES
from msgq import tcp_port
from msgq.zmq import Poller, SubSocket
from oproute.video import KEYFRAME_FLAG, fill_frame
from camerad.sources import Source, SourceError, Tick

log = logging.getLogger("camerad")
JOIN_S = 0.15       # after the first camera, how long the others get before serving starts (a running device sends all
                    # of its cameras within a frame period); a camera that comes later joins while serving
QUIET_S = 3.0       # a device silent this long is reported, once, and again when it is back
RECV_MS = 100       # how often the threads look at their stop flag
MAX_SIDE = 4096     # a camera's width and height at most (openpilot's are 1928x1208 at most): a larger one is refused
OUT_ITEMS = 1024    # what the threads hand the serving loop, waiting at most (a device flooding messages waits on it)
NOT_SERVED = "frames behind, decoded but not served (a newer one was waiting)"
# what the daemons read from the car and the device, relayed as it arrives (the camera states are camerad's own)
RELAYED = tuple(dict.fromkeys(s for s in MODELD_INPUTS + DMONITORINGD_INPUTS if s not in CAMERA_STATE_SERVICES.values() and s not in DAEMON_OUTPUTS))

def refused_size(ed, size: tuple[int, int] | None) -> str | None:
  """Why a camera's EncodeData is refused for its size, or None: over MAX_SIDE, odd or empty (a device can declare any;
  camerad's buffers are made to it), or another than its stream's once served."""
  if size is not None: return None if (ed.width, ed.height) == size else f"frames declaring another size than the stream's {size[0]}x{size[1]}"
  if not (0 < ed.width <= MAX_SIDE and 0 < ed.height <= MAX_SIDE) or ed.width % 2 or ed.height % 2:
    return f"frames of a size that is no camera's (at most {MAX_SIDE}x{MAX_SIDE}, even)"
  return None

def device_socket(host: str, service: str) -> SubSocket:
  """A subscription to a service of openpilot's bridge on `host`: its port comes from the service name alone, whatever
  OPENPILOT_PREFIX this stack runs under."""
  return SubSocket(service, host, False, SERVICES[service].queue_size, port=tcp_port(service, ""))

class CameraStream(threading.Thread):
  """One camera's EncodeData, decoded from a keyframe on, the keyframe's header first. A gap in encodeId (lost
  packets) or its restart (the device's encoder restarted) drops the decoder; decoding starts again at the next
  keyframe, so no picture decoded from a missing reference is ever served. Each receive takes every message waiting:
  with more than one (camerad fell behind, or a burst after a stall) it starts at the newest keyframe among them, and
  only the newest picture is served. What it makes and sees goes to `out`: ("frame", stream, picture, frame id, SOF,
  EOF, device logMonoTime, arrival ns, decode s, (width, height)), ("lost", stream, frames or None for a restart),
  ("skip", reason, count)."""
  def __init__(self, stream: int, sock: SubSocket, first: list[tuple[bytes, int]], out: queue.Queue, stop: threading.Event,
               size: tuple[int, int] | None):
    super().__init__(name=f"bridge-{CAMERA_OF_STREAM[stream]}", daemon=True)
    self.stream, self.sock, self.first, self.out, self.stop, self.size = stream, sock, first, out, stop, size
    self.cam, self.service = CAMERA_OF_STREAM[stream], CAMERAS[CAMERA_OF_STREAM[stream]].encode_data
    self.decoder, self.last_id, self.meta = None, None, {}

  def run(self) -> None:
    batch, self.sock.timeout = self.first, RECV_MS
    try:
      while not self.stop.is_set():
        if batch: self.handle(batch)
        batch = []   # what is waiting, up to what the socket's queue holds: a device sending faster than we take cannot grow it
        while len(batch) < self.sock.hwm and (dat := self.sock.receive(non_blocking=bool(batch))) is not None:
          batch.append((dat, time.monotonic_ns()))
    finally: self.sock.close()

  def handle(self, batch: list[tuple[bytes, int]]) -> None:
    evs = []
    for dat, arrived in batch:
      try: ev = messaging.log_from_bytes(dat, expect=self.service)
      except messaging.MalformedMessageError: self.out.put(("skip", f"{self.cam}: malformed {self.service} messages", 1)); continue
      if (why := refused_size(getattr(ev, self.service), self.size)) is not None: self.out.put(("skip", f"{self.cam}: {why}", 1))
      else: evs.append((ev, arrived))
    keys = [i for i, (ev, _) in enumerate(evs) if getattr(ev, self.service).idx.flags & KEYFRAME_FLAG]
    if keys and keys[-1] > 0:   # behind: what comes before the newest keyframe is never needed
      self.out.put(("skip", f"{self.cam}: frames behind, skipped to the newest keyframe", keys[-1]))
      evs, self.decoder, self.last_id = evs[keys[-1]:], None, None
    for i, (ev, arrived) in enumerate(evs):
      self.decode(ev, arrived, serve=i == len(evs) - 1)

  def decode(self, ev, arrived: int, serve: bool) -> None:
    ed = getattr(ev, self.service)
    idx = ed.idx
    if self.last_id is not None and idx.encodeId != self.last_id + 1:
      self.out.put(("lost", self.stream, idx.encodeId - self.last_id - 1 if idx.encodeId > self.last_id else None))
      self.decoder = None
    self.last_id = idx.encodeId
    if self.decoder is None:
      if not idx.flags & KEYFRAME_FLAG:
        self.out.put(("skip", f"{self.cam}: frames before a keyframe (not decodable)", 1))
        return
      self.decoder, self.meta = av.CodecContext.create("hevc", "r"), {}
      self.decoder.options = {"max_pixels": str(ed.width * ed.height)}   # no picture larger than its stream declares
      self.size = (ed.width, ed.height)
      if len(ed.header):
        try: self.decoder.decode(av.Packet(ed.header))
        except av.FFmpegError: pass   # a damaged header: its keyframe does not decode either, and is skipped
    packet, t = av.Packet(ed.data), time.perf_counter()
    packet.pts = idx.encodeId
    self.meta[idx.encodeId] = (idx.frameId, idx.timestampSof, idx.timestampEof, ev.logMonoTime, arrived)
    try: pictures = self.decoder.decode(packet)
    except av.FFmpegError:   # a damaged packet: nothing from it, nor from what refers to it, until a keyframe
      self.out.put(("skip", f"{self.cam}: undecodable frames", 1))
      self.decoder = None
      return
    dt = time.perf_counter() - t
    for p in pictures:
      if (m := self.meta.pop(p.pts, None)) is None: continue
      if (p.width, p.height) != self.size: self.out.put(("skip", f"{self.cam}: pictures of another size than their stream declares", 1))
      elif serve: self.out.put(("frame", self.stream, p, *m, dt, self.size))
      else: self.out.put(("skip", f"{self.cam}: {NOT_SERVED}", 1))

class BridgeSource(Source):
  """`bridge:HOST`: the cameras a comma device (openpilot's encoder and bridge) sends, each at its own pace (live).
  Serving starts JOIN_S after the first camera's frame (waiting up to `wait` s for it); a camera that comes later is
  added to `streams` when its first frame is served. Frame ids and SOF/EOF times are the device's."""
  live = True
  def __init__(self, host: str, wait: float = 30.):
    super().__init__()
    self.host, self.fps, self.services, self.streams = host, 20., RELAYED, {}
    self.socks = {c.stream: device_socket(host, c.encode_data) for c in CAMERAS.values()}
    self.first: dict[int, list[tuple[bytes, int]]] = {s: [] for s in self.socks}
    deadline = time.monotonic() + wait
    try:
      for sock in self.socks.values(): sock.timeout = 0
      while time.monotonic() < deadline and not all(self.first.values()):
        for s, sock in self.socks.items():
          if (dat := sock.receive()) is not None and (size := self.size(s, dat)) is not None:
            if not any(self.first.values()): deadline = min(deadline, time.monotonic() + JOIN_S)
            self.first[s].append((dat, time.monotonic_ns()))
            self.streams[s] = size
        time.sleep(0.002)
      if not any(self.first.values()):
        raise SourceError(f"bridge:{host}: no camera frame within {wait:g} s{self.refusals()}: is openpilot's encoder and bridge running on "
                          f"the device, and {host}'s port {tcp_port('roadEncodeData', '')} (roadEncodeData) reachable?")
    except BaseException:
      self.close()
      raise
    self.sensor = dict.fromkeys(self.streams, "unknown")
    self.offset: int | None = None   # our monotonic clock less the device's, from the fastest frame to arrive

  def size(self, stream: int, dat: bytes) -> tuple[int, int] | None:
    """The size a camera's message declares; None, counted in `skipped`, for a malformed one or a size refused."""
    cam, service = CAMERA_OF_STREAM[stream], CAMERAS[CAMERA_OF_STREAM[stream]].encode_data
    try: ed = getattr(messaging.log_from_bytes(dat, expect=service), service)
    except messaging.MalformedMessageError:
      self.skipped[f"{cam}: malformed {service} messages"] += 1
      return None
    if (why := refused_size(ed, self.streams.get(stream))) is not None:
      self.skipped[f"{cam}: {why}"] += 1
      return None
    return ed.width, ed.height

  def refusals(self) -> str:
    return f" ({'; '.join(f'{n} {why}' for why, n in self.skipped.items())})" if self.skipped else ""

  def ticks(self, start: int = 0) -> Iterator[Tick]:
    out, stop = queue.Queue(OUT_ITEMS), threading.Event()
    threads = [CameraStream(s, sock, self.first[s], out, stop, self.streams.get(s)) for s, sock in self.socks.items()]
    threads.append(threading.Thread(target=self._relay, args=(out, stop), name="bridge-relay", daemon=True))
    for t in threads: t.start()
    self.socks, last, quiet = {}, time.monotonic(), False   # the threads own the sockets now
    try:
      while True:
        try: items = [out.get(timeout=RECV_MS / 1000)]
        except queue.Empty: items = []
        while not out.empty(): items.append(out.get_nowait())
        if not quiet and (now := time.monotonic()) - last > QUIET_S:
          log.warning("bridge:%s: no camera frame for %.0f s: waiting for the device", self.host, now - last)
          quiet = True
        newest = {}   # stream -> its newest frame: an older one still waiting here is never served
        for item in items:
          if item[0] == "msg": yield Tick(-1, time.monotonic(), msgs=[item[1:]])
          elif item[0] == "skip": self.skipped[item[1]] += item[2]
          elif item[0] == "lost":
            cam, n = CAMERA_OF_STREAM[item[1]], item[2]
            if n is None: log.warning("bridge:%s: %s encoder restarted: decoding from its next keyframe", self.host, cam)
            self.skipped[f"{cam}: frames lost on the way (encodeId gaps; decoding resumed at the next keyframe)" if n else f"{cam}: encoder restarts"] += n or 1
          else:
            if item[1] in newest: self.skipped[f"{CAMERA_OF_STREAM[item[1]]}: {NOT_SERVED}"] += 1
            newest[item[1]] = item
        if not items: yield Tick(-1, time.monotonic())   # nothing: camerad looks at its stop flag, feeds its watchdog
        for _, s, picture, frame_id, sof, eof, log_mono, arrived, decode_s, size in newest.values():
          if quiet: log.info("bridge:%s: frames again", self.host)
          last, quiet = time.monotonic(), False
          if s not in self.streams:
            log.info("bridge:%s: the %s camera joined (%dx%d)", self.host, CAMERA_OF_STREAM[s], *size)
            self.streams[s], self.sensor[s] = size, "unknown"
          self.offset = min(self.offset, arrived - log_mono) if self.offset is not None else arrived - log_mono
          yield Tick(frame_id, time.monotonic(), {s: lambda buf, layout, p=picture: fill_frame(p, buf, layout)}, ids={s: (frame_id, sof, eof)},
                     eof_here={s: eof + self.offset}, timings={"decode": decode_s})
    finally:
      stop.set()
      for t in threads: t.join(2)

  def _relay(self, out: queue.Queue, stop: threading.Event) -> None:
    """The device's messages the daemons read, as they arrive, byte for byte."""
    socks, poller = {s: device_socket(self.host, s) for s in RELAYED}, Poller()
    for name, sock in socks.items(): poller.register(sock, name)
    try:
      while not stop.is_set():
        for name in poller.poll(RECV_MS):
          while (dat := socks[name].receive(non_blocking=True)) is not None: out.put(("msg", name, dat))
    finally:
      for sock in socks.values(): sock.close()

  def close(self) -> None:
    for sock in self.socks.values(): sock.close()
    self.socks = {}
