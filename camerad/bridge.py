"""camerad's bridge source: a comma device's cameras as its encoder publishes them (roadEncodeData, wideRoadEncodeData,
driverEncodeData, HEVC) and openpilot's bridge carries them off the device over TCP, decoded here, one thread per
camera, and served with the device's frame ids and times; the device's messages the daemons read are relayed.
docs/CAMERAD.md: live from a comma device.
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
DISCOVER_S = 3.0    # after the first camera, how long the others get to show up (the streams served are fixed then)
QUIET_S = 3.0       # a device silent this long is reported, once, and again when it is back
RECV_MS = 100       # how often the threads look at their stop flag
# what the daemons read from the car and the device, relayed as it arrives (the camera states are camerad's own)
RELAYED = tuple(dict.fromkeys(s for s in MODELD_INPUTS + DMONITORINGD_INPUTS if s not in CAMERA_STATE_SERVICES.values() and s not in DAEMON_OUTPUTS))

def device_socket(host: str, service: str) -> SubSocket:
  """A subscription to a service of openpilot's bridge on `host`: its port comes from the service name alone, whatever
  OPENPILOT_PREFIX this stack runs under."""
  return SubSocket(service, host, False, SERVICES[service].queue_size, port=tcp_port(service, ""))

class CameraStream(threading.Thread):
  """One camera's EncodeData, decoded from a keyframe on, the keyframe's header first. A gap in encodeId (lost
  packets) or its restart (the device's encoder restarted) drops the decoder; decoding starts again at the next
  keyframe, so no picture decoded from a missing reference is ever served. What it makes and sees goes to `out`:
  ("frame", stream, picture, frame id, SOF, EOF, device logMonoTime, arrival ns, decode s), ("lost", stream, frames or
  None for a restart), ("skip", reason)."""
  def __init__(self, stream: int, sock: SubSocket, first: tuple[bytes, int], out: queue.Queue, stop: threading.Event):
    super().__init__(name=f"bridge-{CAMERA_OF_STREAM[stream]}", daemon=True)
    self.stream, self.sock, self.first, self.out, self.stop = stream, sock, first, out, stop
    self.service = CAMERAS[CAMERA_OF_STREAM[stream]].encode_data
    self.decoder, self.last_id, self.meta = None, None, {}

  def run(self) -> None:
    (dat, arrived), self.sock.timeout = self.first, RECV_MS
    try:
      while not self.stop.is_set():
        if dat is not None: self.handle(dat, arrived)
        dat, arrived = self.sock.receive(), time.monotonic_ns()
    finally: self.sock.close()

  def handle(self, dat: bytes, arrived: int) -> None:
    cam = CAMERA_OF_STREAM[self.stream]
    try: ev = messaging.log_from_bytes(dat, expect=self.service)
    except messaging.MalformedMessageError as e:
      self.out.put(("skip", f"{cam}: a malformed {self.service} ({e})"))
      return
    ed = getattr(ev, self.service)
    idx = ed.idx
    if self.last_id is not None and idx.encodeId != self.last_id + 1:
      self.out.put(("lost", self.stream, idx.encodeId - self.last_id - 1 if idx.encodeId > self.last_id else None))
      self.decoder = None
    self.last_id = idx.encodeId
    if self.decoder is None:
      if not idx.flags & KEYFRAME_FLAG:
        self.out.put(("skip", f"{cam}: frames before a keyframe (not decodable)"))
        return
      self.decoder, self.meta = av.CodecContext.create("hevc", "r"), {}
      if len(ed.header): self.decoder.decode(av.Packet(ed.header))
    packet, t = av.Packet(ed.data), time.perf_counter()
    packet.pts = idx.encodeId
    self.meta[idx.encodeId] = (idx.frameId, idx.timestampSof, idx.timestampEof, ev.logMonoTime, arrived)
    try: pictures = self.decoder.decode(packet)
    except av.FFmpegError as e:   # a damaged packet: nothing from it, nor from what refers to it, until a keyframe
      self.out.put(("skip", f"{cam}: undecodable frame {idx.frameId} ({e})"))
      self.decoder = None
      return
    dt = time.perf_counter() - t
    for p in pictures:
      if (m := self.meta.pop(p.pts, None)) is not None: self.out.put(("frame", self.stream, p, *m, dt))

class BridgeSource(Source):
  """`bridge:HOST`: the cameras a comma device (openpilot's encoder and bridge) sends, each at its own pace (live). The
  streams served are those whose frames come within DISCOVER_S of the first one's (waiting up to `wait` s for that);
  frame ids and SOF/EOF times are the device's."""
  live = True
  def __init__(self, host: str, wait: float = 30.):
    super().__init__()
    self.host, self.fps, self.services = host, 20., RELAYED
    socks = {c.stream: device_socket(host, c.encode_data) for c in CAMERAS.values()}
    first, deadline = {}, time.monotonic() + wait
    try:
      for sock in socks.values(): sock.timeout = 0
      while len(first) < len(socks) and time.monotonic() < deadline:
        for s, sock in socks.items():
          if s not in first and (dat := sock.receive()) is not None:
            if not first: deadline = min(deadline, time.monotonic() + DISCOVER_S)
            first[s] = (dat, time.monotonic_ns())
        time.sleep(0.005)
      if not first:
        raise SourceError(f"bridge:{host}: no camera frame within {wait:g} s: is openpilot's encoder and bridge running on the device, "
                          f"and {host}'s port {tcp_port('roadEncodeData', '')} (roadEncodeData) reachable?")
      self.streams = {s: (ed.width, ed.height) for s, (dat, _) in first.items()
                      if (ed := getattr(messaging.log_from_bytes(dat), CAMERAS[CAMERA_OF_STREAM[s]].encode_data))}
    except BaseException:
      for sock in socks.values(): sock.close()
      raise
    for s in set(socks) - set(first): socks.pop(s).close()
    self.socks, self.first = socks, first
    self.sensor = dict.fromkeys(self.streams, "unknown")
    self.offset: int | None = None   # our monotonic clock less the device's, from the fastest frame to arrive

  def drop(self, stream: int) -> None:
    """Serve this stream no more (camerad refused it)."""
    del self.streams[stream], self.sensor[stream], self.first[stream]
    self.socks.pop(stream).close()

  def ticks(self, start: int = 0) -> Iterator[Tick]:
    out, stop = queue.Queue(), threading.Event()
    threads = [CameraStream(s, sock, self.first[s], out, stop) for s, sock in self.socks.items()]
    threads.append(threading.Thread(target=self._relay, args=(out, stop), name="bridge-relay", daemon=True))
    for t in threads: t.start()
    self.socks, last, quiet = {}, time.monotonic(), False   # the threads own the sockets now
    try:
      while True:
        try: item = out.get(timeout=RECV_MS / 1000)
        except queue.Empty: item = None
        if not quiet and (now := time.monotonic()) - last > QUIET_S:
          log.warning("bridge:%s: no camera frame for %.0f s: waiting for the device", self.host, now - last)
          quiet = True
        if item is None: yield Tick(-1, time.monotonic())   # nothing: camerad looks at its stop flag, feeds its watchdog
        elif item[0] == "msg": yield Tick(-1, time.monotonic(), msgs=[item[1:]])
        elif item[0] == "skip": self.skipped[item[1]] += 1
        elif item[0] == "lost":
          cam, n = CAMERA_OF_STREAM[item[1]], item[2]
          if n is None: log.warning("bridge:%s: %s encoder restarted: decoding from its next keyframe", self.host, cam)
          self.skipped[f"{cam}: frames lost on the way (encodeId gaps; decoding resumed at the next keyframe)" if n else f"{cam}: encoder restarts"] += n or 1
        else:
          _, s, picture, frame_id, sof, eof, log_mono, arrived, decode_s = item
          if quiet: log.info("bridge:%s: frames again", self.host)
          last, quiet = time.monotonic(), False
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
