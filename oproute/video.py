"""Camera video in openpilot routes: one HEVC file per camera per segment (fcamera.hevc road, ecamera.hevc wide road,
dcamera.hevc driver), tied to frame ids by EncodeIndex events (roadEncodeIdx, ...): frame `frameId` is picture
`segmentId` (presentation order) of segment `segmentNum`'s file. Decoding goes straight into NV12 buffers of any
layout; encoding writes raw HEVC with no B-frames (decode order is presentation order) and a keyframe first.
"""
from __future__ import annotations
import io, os
from collections import Counter
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from collections.abc import Iterator
import av
import numpy as np
from cereal import messaging
from cereal.services import CAMERAS, SERVICES
from msgq.visionipc.layout import NV12Layout
from oproute.logreader import segment_number
from oproute.writer import private_file

MAX_BAD_PACKETS = 100     # packets in a row that give no picture (undecodable, or decoding to none) before a video counts as no video
MAX_PIXELS = 4096 * 2304  # the largest picture decoded (4K and DCI 4K; openpilot's cameras are 1928x1208): FFmpeg's max_pixels
MAX_GAP = 32 << 20        # bytes FFmpeg may read from a file before the next packet comes out (a demuxer finding none in garbage
                          # would read, and hold, the whole file)
MAX_NALS = 1000           # NAL units in a row that start no picture (HEVC allows a picture 600 slices, plus parameter sets and SEI)
HEVC_FIRST_NALS = {32, 33, 34, 35, 39}   # an HEVC stream starts with a VPS, SPS, PPS, access unit delimiter or SEI
# openpilot's cameras run at the rate of their camera states (one per frame), all at one rate (the unpacking fails if the
# services table ever says otherwise): videos are written at it, and read at it when they have no rate of their own (raw HEVC)
(DEFAULT_FPS,) = {SERVICES[c.state].frequency for c in CAMERAS.values()}
# FFmpeg's demuxers of raw H.265/H.264 streams: no container, no timestamps; the rate they report is their own default (25)
RAW_FORMATS = {"hevc", "h264"}
ROUTE_FORMAT = "hevc"   # a route's camera files are raw HEVC: read as nothing else, whatever their bytes look like
KEYFRAME_FLAG = 0x8       # EncodeIndex.flags of a keyframe (V4L2's keyframe buffer flag, as openpilot's encoder sets)
ENCODE_IDX_OF = {c.encode_idx: name for name, c in CAMERAS.items()}

class VideoError(Exception):
  """A video that cannot be served: the message names the file and what is wrong."""

def fill_frame(frame: av.VideoFrame, out: np.ndarray, layout: NV12Layout) -> None:
  """Write a decoded frame into an NV12 buffer of `layout`: planar 4:2:0 straight from the decoder's planes (Y copied,
  U and V interleaved in place), anything else through PyAV's reformat to NV12 first."""
  if (frame.width, frame.height) != (layout.width, layout.height):
    raise ValueError(f"frame is {frame.width}x{frame.height}, the stream's buffers are {layout.width}x{layout.height}")
  y, u, v = layout.planes(out)
  def plane(i: int, h: int, w: int) -> np.ndarray:
    p = frame.planes[i]
    return np.frombuffer(p, np.uint8).reshape(-1, p.line_size)[:h, :w]
  h, w = layout.height, layout.width
  if frame.format.name != "yuv420p": frame = frame.reformat(format="nv12")
  y[...] = plane(0, h, w)
  if frame.format.name == "nv12":
    uv = plane(1, h // 2, w)
    u[...], v[...] = uv[:, 0::2], uv[:, 1::2]
  else:
    u[...], v[...] = plane(1, h // 2, w // 2), plane(2, h // 2, w // 2)

class BoundedVideoFile(io.RawIOBase):
  """A video file as FFmpeg reads it, refused (VideoError naming the file and the byte) where FFmpeg would hold more
  than a few pictures' worth of it: MAX_GAP bytes read without a packet coming out (mark() says one did), and in an
  Annex B stream (raw HEVC or H.264: the file starts with a start code) MAX_NALS NAL units in a row that start no
  picture (FFmpeg's parser keeps a few KiB for each NAL unit of the packet it builds)."""
  def __init__(self, path: str):
    self.path, self.f, self.since = path, open(path, "rb", buffering=0), 0
    head = self.f.read(8)
    self.f.seek(0)
    start = 3 if head.startswith(b"\x00\x00\x01") else 4 if head.startswith(b"\x00\x00\x00\x01") else 0
    self.hevc = start and (head[start] >> 1) & 0x3f in HEVC_FIRST_NALS   # else H.264's NAL header
    self.annex_b, self.tail, self.nals = bool(start), b"", 0

  def readable(self) -> bool: return True
  def seekable(self) -> bool: return True
  def tell(self) -> int: return self.f.tell()
  def mark(self) -> None: self.since = 0

  def seek(self, offset: int, whence: int = 0) -> int:
    self.tail = b""   # the bytes read next are not those after the tail
    return self.f.seek(offset, whence)

  def readinto(self, b) -> int:
    if self.since >= MAX_GAP:
      raise VideoError(f"{self.path}: no video packet in the {self.since} bytes read up to byte {self.f.tell()} "
                       f"(MAX_GAP: {MAX_GAP >> 20} MiB at most): not a video FFmpeg can split into pictures")
    at, n = self.f.tell(), self.f.readinto(b)
    self.since += n
    if self.annex_b and n: self._count_nals(bytes(memoryview(b)[:n]), at)
    return n

  def _count_nals(self, chunk: bytes, at: int) -> None:
    data, base, i = self.tail + chunk, at - len(self.tail), 0
    while (p := data.find(b"\x00\x00\x01", i)) >= 0 and p + 6 <= len(data):
      h = data[p + 3:p + 6]
      if (h[0] >> 1 & 0x3f < 32 and h[2] & 0x80) if self.hevc else (h[0] & 0x1f in (1, 5) and h[1] & 0x80): self.nals = 0   # a picture's first slice
      elif (n := self.nals + 1) > MAX_NALS:
        raise VideoError(f"{self.path}: {n} NAL units in a row up to byte {base + p} start no picture (MAX_NALS: {MAX_NALS} "
                         f"at most): not a video stream")
      else: self.nals = n
      i = p + 3
    self.tail = data[p if p >= 0 else max(i, len(data) - 2):]   # a start code the chunk's end cut, or its first bytes

  def close(self) -> None:
    self.f.close()
    super().close()

class VideoDecoder:
  """Decoded frames of one video file or V4L2 device. Damaged packets are skipped and counted in `skipped`; so many in
  a row that nothing decodes is a VideoError, as are pictures over MAX_PIXELS and a file FFmpeg would hold too much of
  (BoundedVideoFile). threads: decoder threads (0: as many as FFmpeg sees fit; 1 for a worker that is meant to keep to
  one core). Threads share a picture's slices (or rows), never pictures: frame threads hold a picture back per thread
  (late live frames) and, past a damaged one, drop the pictures one thread decodes."""
  def __init__(self, path: str | Path, skipped: Counter, fmt: str | None = None, threads: int = 0):
    self.path, self.skipped = str(path), skipped
    self.file = None if fmt == "v4l2" else BoundedVideoFile(self.path)   # a device is read by its driver's frames
    limit = {"max_pixels": str(MAX_PIXELS)}   # for the pictures FFmpeg decodes while it opens the file
    try: self.container = av.open(self.file or self.path, format=fmt, options=limit)
    except (av.FFmpegError, OSError) as e:
      self.close()
      raise VideoError(f"{path}: cannot open as video ({e})") from None
    except BaseException:
      self.close()
      raise
    if not self.container.streams.video:
      self.close()
      raise VideoError(f"{path}: no video stream (streams: {[s.type for s in self.container.streams] or 'none'})")
    self.stream = st = self.container.streams.video[0]
    st.thread_type, st.codec_context.thread_count, st.codec_context.options = "SLICE", threads, limit
    self.width, self.height = st.codec_context.width, st.codec_context.height
    if self.width <= 0 or self.height <= 0 or self.width % 2 or self.height % 2 or self.width * self.height > MAX_PIXELS:
      self.close()
      raise VideoError(f"{path}: no picture size in it (empty, or cut before its first picture)" if not self.width * self.height else
                       f"{path}: video is {self.width}x{self.height}, over the {MAX_PIXELS} pixels decoded at most (MAX_PIXELS)"
                       if self.width * self.height > MAX_PIXELS else
                       f"{path}: video is {self.width}x{self.height}; NV12 buffers need a positive even width and height")
    rate = None if self.container.format.name in RAW_FORMATS else st.average_rate or st.guessed_rate or st.base_rate
    self.fps = float(rate) if rate and 0 < float(rate) < 1000 else DEFAULT_FPS

  def frames(self) -> Iterator[av.VideoFrame]:
    bad = packets_in = pictures = 0   # a packet holds one picture: the decoder drops some unsaid, counted at the end
    packets, why = self.container.demux(self.stream), "none decoded to a picture"
    while True:
      try: packet = next(packets)
      except StopIteration: break
      except av.FFmpegError as e:   # a container cut short or damaged past repair: the frames so far are all there is
        self.skipped[f"{self.path}: unreadable from here ({e})"] += 1
        break
      if self.file: self.file.mark()
      try: decoded = packet.decode()
      except av.FFmpegError as e:   # counted here, not as a packet that decoded to no picture
        decoded, why = [], f"{type(e).__name__}: {e}"
        self.skipped[f"{self.path}: undecodable packet ({type(e).__name__})"] += 1
      else: packets_in += packet.size > 0
      bad += packet.size > 0
      for frame in decoded:
        bad, pictures = 0, pictures + 1
        if (frame.width, frame.height) != (self.width, self.height):
          self.skipped[f"{self.path}: frame of {frame.width}x{frame.height} in a {self.width}x{self.height} stream"] += 1
          continue
        yield frame
      if bad >= MAX_BAD_PACKETS:
        raise VideoError(f"{self.path}: {bad} packets in a row up to byte {packet.pos} gave no picture ({why})")
    if (lost := packets_in - pictures) > 0: self.skipped[f"{self.path}: packet decoded to no picture"] += lost

  def close(self) -> None:
    if (c := getattr(self, "container", None)) is not None: c.close()
    if self.file is not None: self.file.close()

def video_size(path: Path, fmt: str | None = None) -> tuple[int, int]:
  """(width, height) of a video file; VideoError if it does not open."""
  d = VideoDecoder(path, Counter(), fmt)
  d.close()
  return d.width, d.height

class EncodeIndex:
  """Where each camera's frames are: {camera: {frameId: [(segmentNum, segmentId, timestampSof), ...]}}, from a route's
  EncodeIndex events (full-resolution HEVC ones only; a qcamera index is another file). A frame id can be in a route
  more than once: a camera restarted mid-route numbers its frames from 0 again; its start-of-frame time tells them apart."""
  def __init__(self):
    self.frames: dict[str, dict[int, list[tuple[int, int, int]]]] = {}

  def add(self, ev) -> bool:
    """Take ev if it is an EncodeIndex event of a camera's HEVC file; True if it was one."""
    if (cam := ENCODE_IDX_OF.get(ev.which())) is None: return False
    e = getattr(ev, ev.which())
    if e.type == "fullHEVC": self.frames.setdefault(cam, {}).setdefault(e.frameId, []).append((e.segmentNum, e.segmentId, e.timestampSof))
    return True

class CameraVideo:
  """One camera's frames of a route by frame id, decoded in file order: `frame(frame_id, sof)` for the frames in the
  order the route logged them, each the decoded picture or None (not in the video: counted in `skipped`). A frame is
  the picture indexed with its id and start-of-frame time (a camera restarted mid-route reuses ids); given no time,
  or an index without times, the next picture of that id after the last decoded. segments: {segmentNum: segment folder}."""
  def __init__(self, camera: str, segments: dict[int, Path], index: dict[int, list[tuple[int, int, int]]], skipped: Counter, threads: int = 0):
    self.camera, self.segments, self.skipped, self.threads = camera, segments, skipped, threads
    self.index = {fid: sorted(places) for fid, places in index.items()}
    self._seg, self._n, self._frames, self._dec = None, -1, iter(()), None

  @classmethod
  def of(cls, camera: str, logs: list[Path], index: EncodeIndex, skipped: Counter, threads: int = 0) -> CameraVideo | None:
    """The camera's video in the segments of these log files (None if the index has none of its frames)."""
    if camera not in index.frames: return None
    segs = {segment_number(f.parent): f.parent for f in logs}
    if -1 in segs: segs = {p[0]: segs[-1] for places in index.frames[camera].values() for p in places}   # a lone log file: its video beside it
    return cls(camera, segs, index.frames[camera], skipped, threads)

  def files(self) -> list[Path]:
    segs = sorted({p[0] for places in self.index.values() for p in places})
    return [f for n in segs if n in self.segments and (f := self.segments[n] / CAMERAS[self.camera].video).is_file()]

  def size(self) -> tuple[int, int]:
    """(width, height) of the first video file; VideoError if there is none that opens."""
    if not (files := self.files()): raise VideoError(f"no {CAMERAS[self.camera].video} for the {self.camera} camera's indexed frames")
    return video_size(files[0], ROUTE_FORMAT)

  def _open(self, seg: int) -> None:
    self.close()
    self._seg = seg
    path = self.segments.get(seg, Path(f"<segment {seg}>")) / CAMERAS[self.camera].video
    try:
      self._dec = VideoDecoder(path, self.skipped, ROUTE_FORMAT, threads=self.threads)
      self._frames = self._dec.frames()
    except VideoError as e: self.skipped[str(e)] += 1

  def frame(self, frame_id: int, sof: int | None = None) -> av.VideoFrame | None:
    if (places := self.index.get(frame_id)) is None:
      self.skipped[f"{self.camera}: frame {frame_id} has no {CAMERAS[self.camera].encode_idx}"] += 1
      return None
    here = (self._seg, self._n) if self._seg is not None else (-1, -1)
    if sof is not None and any(p[2] for p in places):   # the picture of this very frame: another run's has another time
      if (where := next((p for p in places if p[2] == sof), None)) is None:
        self.skipped[f"{self.camera}: frame {frame_id} at {sof} has no {CAMERAS[self.camera].encode_idx}"] += 1
        return None
    else: where = next((p for p in places if p[:2] > here), places[-1])   # no times to go by: the next in the files
    seg, i, _ = where
    if (seg, i) <= here: return self._missing()   # a picture already passed
    if seg != self._seg: self._open(seg)
    while self._n < i:
      if (f := next(self._frames, None)) is None: return self._missing()
      self._n += 1
      if self._n == i: return f
    return self._missing()   # asked for a picture already passed

  def _missing(self) -> None:
    where = self.segments[self._seg] / CAMERAS[self.camera].video if self._seg in self.segments else "the video"
    self.skipped[f"{self.camera} frame missing from {where}"] += 1
    return None

  def close(self) -> None:
    """Close the file being decoded and rewind: a later frame() starts from the route's beginning (a new loop pass)."""
    if self._dec is not None: self._dec.close()
    self._seg, self._n, self._frames, self._dec = None, -1, iter(()), None

@dataclass
class EncodedFrame:
  frame_id: int
  index: int        # in the file, presentation (= encode) order
  size: int         # bytes
  keyframe: bool
  timestamp_sof: int
  timestamp_eof: int

  def index_event(self, camera: str, segment: int, encode_id: int, log_mono_time: int | None = None) -> bytes:
    """The camera's EncodeIndex event (roadEncodeIdx, ...) that places this frame in segment's file."""
    svc = CAMERAS[camera].encode_idx
    msg = messaging.new_message(svc, **({} if log_mono_time is None else {"logMonoTime": log_mono_time}))
    ei = getattr(msg, svc)
    ei.frameId, ei.type, ei.encodeId, ei.segmentNum = self.frame_id, "fullHEVC", encode_id, segment
    ei.segmentId = ei.segmentIdEncode = self.index
    ei.timestampSof, ei.timestampEof, ei.len = self.timestamp_sof, self.timestamp_eof, self.size
    ei.flags = KEYFRAME_FLAG if self.keyframe else 0
    return msg.to_bytes()

def picture(buf: np.ndarray, layout: NV12Layout) -> av.VideoFrame:
  """A planar 4:2:0 copy of the NV12 picture in buf (of layout), for an encoder."""
  frame = av.VideoFrame(layout.width, layout.height, "yuv420p")
  for p, src in zip(frame.planes, layout.planes(buf)):
    np.frombuffer(p, np.uint8).reshape(-1, p.line_size)[:src.shape[0], :src.shape[1]] = src
  return frame

class HevcWriter:
  """A raw HEVC file (libx265, no B-frames, a keyframe every `keyint` frames and first). write() returns the frames
  whose packets came out, for their EncodeIndex events; close() returns the rest. lossless: x265's lossless mode (a
  replay serves the very same pixels)."""
  def __init__(self, path: Path, width: int, height: int, fps: float = DEFAULT_FPS, keyint: int = 20, lossless: bool = False):
    self.file = os.fdopen(private_file(path), "wb", buffering=0)   # 0600 whatever the umask: a recording is the driver's
    self.container = av.open(self.file, "w", format="hevc")
    st = self.stream = self.container.add_stream("libx265", rate=Fraction(round(fps * 1000), 1000))
    st.width, st.height, st.pix_fmt = width, height, "yuv420p"
    params = f"log-level=error:bframes=0:keyint={keyint}:min-keyint={keyint}:scenecut=0" + (":lossless=1" if lossless else "")
    # tune zerolatency: one frame thread, no lookahead (libx265 has crashed flushing a multi-threaded lookahead). Its
    # worker pool encodes 64-pixel CTU rows in parallel: a frame of a few rows gains nothing, so it stays on this thread
    if height <= 4 * 64: params += ":pools=none"
    st.codec_context.options = {"preset": "ultrafast", "tune": "zerolatency", "x265-params": params}
    self.width, self.height, self.n, self.meta = width, height, 0, {}

  def write(self, frame: av.VideoFrame, frame_id: int, sof: int, eof: int) -> list[EncodedFrame]:
    frame.pts = self.n
    self.meta[self.n] = (frame_id, sof, eof)
    self.n += 1
    return self._mux(self.stream.encode(frame))

  def _mux(self, packets) -> list[EncodedFrame]:
    out = []
    for p in packets:
      fid, sof, eof = self.meta.pop(p.pts)
      out.append(EncodedFrame(fid, p.pts, p.size, p.is_keyframe, sof, eof))
      self.container.mux(p)
    return out

  def close(self) -> list[EncodedFrame]:
    try: out = self._mux(self.stream.encode())
    finally:
      try: self.container.close()
      finally: self.file.close()
    return out
