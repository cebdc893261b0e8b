"""modeld-fakedevice: a comma device's encoded cameras and calibration, as openpilot's encoder and bridge serve them,
for camerad's bridge source when there is no car: a clip of a camerad source (a scene, video files) is encoded once
(HEVC, a keyframe with the codec's header every --keyint frames) and sent in a loop, with fresh frame ids and times.
--drop-every and --restart-every make the faults a real link and device have.
"""
from __future__ import annotations
import argparse, sys, time
from fractions import Fraction
import numpy as np
from service import StopFlag, add_log_level, setup_logging
from service.extras import needs_extra
from cereal import messaging
from cereal.services import CAMERA_OF_STREAM, CAMERAS, SERVICES
from msgq import IpcError, max_message, tcp_port
from msgq.tcp import TcpPublisher
from msgq.visionipc.layout import NV12Layout
with needs_extra("modeld-fakedevice", "camera"):   # PyAV
  import av
  from oproute.video import KEYFRAME_FLAG, picture
  from camerad.sources import SourceError, open_source

SEGMENT_S = 60.   # openpilot's segment length: the frames' segmentNum

EPILOG = """examples:
  modeld-fakedevice --source synthetic:straight &               the road, wide and driver cameras of a scene, looping
  camerad --source bridge:127.0.0.1 --artifacts artifacts &    what runs on the PC beside a real device too
  modeld-fakedevice --source road=drive.mp4 --clip 200          one camera, the first 200 frames of a video
  modeld-fakedevice --source synthetic:straight --drop-every 50 --restart-every 400   a lossy link, a rebooting device
"""

class Encoder:
  """One camera's clip as openpilot's encoder writes it: libx265, no B-frames, a keyframe every `keyint` frames, the
  codec's header (VPS, SPS, PPS) apart from the frames (openpilot sends it with each keyframe)."""
  def __init__(self, width: int, height: int, fps: float, keyint: int):
    self.ctx = av.CodecContext.create("libx265", "w")
    self.ctx.width, self.ctx.height, self.ctx.pix_fmt, self.ctx.time_base = width, height, "yuv420p", Fraction(1, round(fps))
    self.ctx.options = {"preset": "ultrafast", "tune": "zerolatency",
                        "x265-params": f"log-level=error:bframes=0:keyint={keyint}:min-keyint={keyint}:scenecut=0"}
    self.ctx.flags |= av.codec.context.Flags.global_header
    self.ctx.open()
    self.header, self.layout, self.n = bytes(self.ctx.extradata), NV12Layout.packed(width, height), 0

  def encode(self, nv12: np.ndarray) -> tuple[bytes, bool]:
    f = picture(nv12, self.layout)
    f.pts, self.n = self.n, self.n + 1
    (p,) = self.ctx.encode(f)   # zerolatency, no B-frames: a packet per picture, at once
    return bytes(p), p.is_keyframe

Clip = list[tuple[bytes, bool]]   # a camera's encoded frames and whether each is a keyframe

def clips(specs: list[str], cameras: list[str] | None, n: int, keyint: int) -> tuple[dict[int, Clip], dict[int, Encoder], list[list], float]:
  """The first n frames (rounded down to whole keyframe intervals) of each camera of the source, encoded, and the
  messages the source sends with each frame."""
  src = open_source(specs, cameras)
  encs = {s: Encoder(w, h, src.fps, keyint) for s, (w, h) in src.streams.items()}
  frames, msgs = {s: [] for s in encs}, []
  bufs = {s: np.empty(e.layout.size, np.uint8) for s, e in encs.items()}
  for tick in src.ticks():
    if tick.frames:
      if len(msgs) >= n: break
      for s, fill in tick.frames.items():
        fill(bufs[s], encs[s].layout)
        frames[s].append(encs[s].encode(bufs[s]))
      msgs.append(list(tick.msgs))
    elif msgs: msgs[-1] += tick.msgs
  src.close()
  if (n := len(msgs) // keyint * keyint) == 0: raise SourceError(f"--source {' '.join(specs)}: fewer than --keyint {keyint} frames")
  return {s: f[:n] for s, f in frames.items()}, encs, msgs[:n], src.fps

def publisher(bind: str, service: str) -> TcpPublisher:
  """The service's port of openpilot's bridge (the name alone sets it), served as this project's publishers serve TCP."""
  return TcpPublisher(service, bind, tcp_port(service, ""), max_message(SERVICES[service].queue_size))

def main(argv: list[str] | None = None) -> int:
  ap = argparse.ArgumentParser(prog="modeld-fakedevice", description=__doc__.split("\n\n")[0], epilog=EPILOG,
                               formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--source", action="extend", nargs="+", default=[], metavar="SPEC", help="what to encode: a camerad source (camerad --help), "
                  "default synthetic:straight")
  ap.add_argument("--cameras", metavar="LIST", help="synthetic only: the cameras of the scene to send (default: all; e.g. road)")
  ap.add_argument("--bind", default="127.0.0.1", help="address to serve on (default: 127.0.0.1; a device's bridge serves every interface)")
  ap.add_argument("--clip", type=int, default=40, metavar="N", help="frames encoded and looped (default: 40)")
  ap.add_argument("--keyint", type=int, default=20, metavar="N", help="a keyframe every N frames (default: 20)")
  ap.add_argument("--frames", type=int, metavar="N", help="stop after N frames (default: run until stopped)")
  ap.add_argument("--drop-every", type=int, metavar="N", help="leave out every Nth encoded frame of each camera, as a lossy link does")
  ap.add_argument("--late", action="append", default=[], metavar="CAM=S", help="start sending camera CAM S seconds after the "
                  "others, as a device whose camera comes up late (repeatable)")
  ap.add_argument("--restart-every", type=int, metavar="N", help="restart every N frames, as a rebooting device: frame ids and "
                  "encodeIds from 0 again, the clip from its keyframe")
  add_log_level(ap)
  args = ap.parse_args(argv)
  for opt in ("clip", "keyint", "frames", "drop_every", "restart_every"):
    if (v := getattr(args, opt)) is not None and v < 1: ap.error(f"--{opt.replace('_', '-')}: expected >= 1, got {v}")
  late = {}
  for spec in args.late:
    cam, _, secs = spec.partition("=")
    try: late[CAMERAS[cam].stream] = float(secs)
    except (KeyError, ValueError): ap.error(f"--late: expected CAM=SECONDS with CAM one of {', '.join(CAMERAS)}, got {spec!r}")
  setup_logging(args.log_level)
  stop = StopFlag()
  try: frames, encs, msgs, fps = clips(args.source or ["synthetic:straight"], args.cameras and args.cameras.split(","), args.clip, args.keyint)
  except SourceError as e:
    print(f"modeld-fakedevice: {e}", file=sys.stderr)
    return 1
  socks, msg_socks = {}, {}
  try:
    for s in frames: socks[s] = publisher(args.bind, CAMERAS[CAMERA_OF_STREAM[s]].encode_data)
    for svc in {svc for m in msgs for svc, _ in m}: msg_socks[svc] = publisher(args.bind, svc)
  except IpcError as e:
    for p in [*socks.values(), *msg_socks.values()]: p.close()
    print(f"modeld-fakedevice: {e}", file=sys.stderr)
    return 1
  print(f"modeld-fakedevice: serving {', '.join(f'{CAMERA_OF_STREAM[s]} {e.layout.width}x{e.layout.height}' for s, e in encs.items())} "
        f"on {args.bind} ({len(msgs)} frames in a loop, {fps:g} frames/s)", flush=True)
  n, t0, period, frame_id = len(msgs), time.monotonic(), 1 / fps, 0
  encode_id = dict.fromkeys(frames, 0)
  try:
    for i in range(args.frames or sys.maxsize):
      if stop: break
      time.sleep(max(0., t0 + i * period - time.monotonic()))
      if args.restart_every and i and i % args.restart_every == 0:
        frame_id, encode_id = 0, dict.fromkeys(frames, 0)   # and the clip from its start, a keyframe
      k = frame_id % n
      for svc, m in msgs[k]:
        if not isinstance(m, bytes):   # a builder, sent again each loop: stamped when sent
          m.clear_write_flag()
          m.logMonoTime = time.monotonic_ns()
        msg_socks[svc].send(m if isinstance(m, bytes) else m.to_bytes())
      eof = time.monotonic_ns()   # the frame read out just now (its encoding took no time: it was done beforehand)
      for s, clip in frames.items():
        if i * period < late.get(s, 0): continue
        data, key = clip[k]
        eid, encode_id[s] = encode_id[s], encode_id[s] + 1
        if args.drop_every and eid % args.drop_every == args.drop_every - 1: continue   # lost on the way
        svc = CAMERAS[CAMERA_OF_STREAM[s]].encode_data
        ev = messaging.new_message(svc)
        ed = getattr(ev, svc)
        ed.idx.frameId, ed.idx.type, ed.idx.encodeId = frame_id, "fullHEVC", eid
        ed.idx.segmentNum, ed.idx.segmentId = int(frame_id * period // SEGMENT_S), frame_id % round(SEGMENT_S * fps)
        ed.idx.segmentIdEncode = ed.idx.segmentId
        ed.idx.timestampSof, ed.idx.timestampEof = eof - int(period * 1e9 / 2), eof   # a readout of half the frame time
        ed.idx.flags, ed.idx.len = KEYFRAME_FLAG if key else 0, len(data)
        ed.data, ed.unixTimestampNanos, ed.width, ed.height = data, time.time_ns(), encs[s].layout.width, encs[s].layout.height
        if key: ed.header = encs[s].header
        socks[s].send(ev.to_bytes())
      frame_id += 1
  finally:
    for p in [*socks.values(), *msg_socks.values()]: p.close()
  return 0

if __name__ == "__main__":
  sys.exit(main())
