"""An openpilot route made the way openpilot makes one, with openpilot's own schema (openpilot-logging's files): no
real route is reachable offline, so tests build one. Per segment: rlog.zst (initData, then per frame carState, a
liveCalibration every 5th frame, and each camera's FrameData + EncodeIndex) and qlog.zst, and the cameras' HEVC
files (libx265 through PyAV, as modeld-record writes them) from a synthetic scene's frames."""
from __future__ import annotations
import subprocess, sys, time
from pathlib import Path
import zstandard as zstd
from camerad.render import SceneRenderer
from camerad.scene import load_scene
from msgq.visionipc.layout import NV12Layout
from oproute.video import HevcWriter, picture
from tests import openpilot_ref as op
from tests.artifacts import REPO

FRAME_NS = 50_000_000
CAMS = {"road": ("roadCameraState", "roadEncodeIdx", "fcamera.hevc"), "driver": ("driverCameraState", "driverEncodeIdx", "dcamera.hevc"),
        "wide": ("wideRoadCameraState", "wideRoadEncodeIdx", "ecamera.hevc")}

def event(kind: str, t: int, **fields):
  msg = op.log.Event.new_message(logMonoTime=t, valid=True)
  body = msg.init(kind)
  for k, v in fields.items(): setattr(body, k, v)
  return msg

def write_route(path: Path, scene_file: Path, cameras: tuple[str, ...] = ("road", "driver"), segments: int = 2, frames: int = 10,
                first_frame_id: int = 100, t0: int = 10**12, extra=None, missing=frozenset(), restart: int | None = None) -> list[int]:
  """The route folder path/<name>--<n>; returns the frame ids, which start at first_frame_id (as a segment in the
  middle of a drive). extra(frame_id, t) -> [events] adds events after each frame's. missing: (camera, frame id) pairs
  the encoder dropped: the camera state is logged, the picture and its EncodeIdx event are not (or (camera, -1 - n):
  the route's n-th frame). restart: the route's frame from which the ids start again at first_frame_id (camerad
  restarted)."""
  scene, ids, encode_id = load_scene(str(scene_file)), [], {c: 0 for c in cameras}
  for seg in range(segments):
    d = path / f"{path.name}--{seg}"
    d.mkdir(parents=True)
    evs = [event("initData", t0 + seg * frames * FRAME_NS, deviceType="tici", version="0.11.1", wallTimeNanos=1_700_000_000 * 10**9)]
    writers, pictures = {}, dict.fromkeys(cameras, 0)   # pictures: in the segment's file so far
    for c in cameras:
      cam = scene.cameras[c]
      writers[c] = (HevcWriter(d / CAMS[c][2], cam.width, cam.height, lossless=True), SceneRenderer(scene, c, NV12Layout.packed(cam.width, cam.height)))
    for i in range(frames):
      n = seg * frames + i
      fid, t = first_frame_id + (n if restart is None or n < restart else n - restart), t0 + n * FRAME_NS
      ids.append(fid)
      evs.append(event("carState", t + 1, vEgo=20.0, aEgo=0.0, vEgoRaw=20.0))
      if n % 5 == 0:
        cal = event("liveCalibration", t + 2, calPerc=100, rpyCalib=list(scene.calib), height=[scene.height])
        cal.liveCalibration.calStatus = "calibrated"
        evs.append(cal)
      for c in cameras:
        state_svc, idx_svc, _ = CAMS[c]
        w, r = writers[c]
        s = event(state_svc, t + 10, frameId=fid, timestampSof=t, timestampEof=t + 5_000_000)
        getattr(s, state_svc).sensor = "ar0231"
        evs.append(s)
        if (c, fid) in missing or (c, -1 - n) in missing: continue
        w.write(picture(r.render(n % scene.n_frames), r.layout), fid, t, t + 5_000_000)
        e = event(idx_svc, t + 20, frameId=fid, encodeId=encode_id[c], segmentNum=seg, segmentId=pictures[c], segmentIdEncode=pictures[c],
                  timestampSof=t, timestampEof=t + 5_000_000)
        getattr(e, idx_svc).type = "fullHEVC"
        evs.append(e)
        encode_id[c], pictures[c] = encode_id[c] + 1, pictures[c] + 1
      if extra is not None: evs += extra(fid, t + 30)
    for w, _ in writers.values(): w.close()
    dats = [(e.which(), e.to_bytes()) for e in evs]
    (d / "rlog.zst").write_bytes(zstd.ZstdCompressor(level=10).compress(b"".join(b for _, b in dats)))
    qlog = [b for w, b in dats if w in ("initData", "liveCalibration") or w.endswith("EncodeIdx")]
    (d / "qlog.zst").write_bytes(zstd.ZstdCompressor(level=10).compress(b"".join(qlog)))
  return ids

def lockstep(route: Path, col, *args) -> None:
  """camerad --lockstep on the route until it ends (exit 0, else its stderr in the error), the collector
  (daemon_harness.Collector) reading the outputs as they come (a subscriber's queue is bounded; the last ones may
  still be on their way)."""
  cam = subprocess.Popen([sys.executable, "-m", "camerad", "--source", route, "--lockstep", "--lockstep-timeout", "60", *args],
                         cwd=REPO, stderr=subprocess.PIPE, text=True)
  while cam.poll() is None:
    col.poll()
    time.sleep(0.01)
  err = cam.communicate()[1]
  assert cam.returncode == 0, err
