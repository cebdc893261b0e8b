"""One segment through the daemons' own frame code on a Ray worker: the batch's unit of work. It is read and framed as
`camerad --lockstep` serves it (camerad's route source and FrameWriter), run through modeld's RoadModel and
dmonitoringd's DriverModel from fresh history, and written to <out>/rlog.zst on the source's clock, the videos linked
beside it, under a temporary name of the run's own renamed when complete. What equals what: docs/BATCH.md."""
from __future__ import annotations
import contextlib, glob, json, logging, math, os, shutil, time, traceback, uuid
from pathlib import Path
import ray
from service.owned import private_umask

log = logging.getLogger("modeld-batch")
COUNTS = "counts.json"   # beside a segment's rlog.zst, renamed with it: its counts, for the summary of a run that resumes it

def remove_temp_outputs(out: Path) -> None:
  """What earlier runs of segment out left unfinished: each run writes under a name of its own (.<route>--<n>.<id>.tmp),
  so one whose worker was taken for lost but still writes (on a shared file system) cannot write into another's."""
  for tmp in out.parent.glob(f".{glob.escape(out.name)}.*tmp"): shutil.rmtree(tmp, ignore_errors=True)

class Frame:
  """A decoded camera frame in a host buffer, with what a VisionIPC frame carries besides its memory."""
  def __init__(self, buf, frame_id: int, timestamp_sof: int, timestamp_eof: int):
    self.buf, self.frame_id, self.timestamp_sof, self.timestamp_eof = buf, frame_id, timestamp_sof, timestamp_eof
  def __getattr__(self, k): return getattr(self.buf, k)   # addr, idx, stream, width, height, stride, uv_offset, size, layout
  def overwritten(self) -> bool: return False   # nobody else writes a worker's buffers

class Runners:
  """A worker's loaded artifacts: models loaded once, warps per camera layout as segments need them; and host buffers
  per stream and layout, which outlive the tensors the runners keep over them. threads: how many threads replay each
  model's kernels and decode each video; device: the artifacts' tinygrad device (default: this process's);
  batch_frames: segments run side by side, each in a slot of one batch (modelrt.batch), its runners and buffers its own."""
  def __init__(self, artifacts: str, threads: int = 1, device: str | None = None, batch_frames: int = 1):
    from modelrt.artifact import load_artifact, use_device
    from modelrt.batch import Batch
    self.threads = threads
    if device: device = use_device(device)
    self.arts = {f: load_artifact(artifacts, f, device) for f in ('road', 'dm')}
    self.batch = Batch(self.arts, batch_frames, threads) if batch_frames > 1 else None
    # ready to serve at speed, as a daemon after its warm-up (the warps: per layout, later)
    for m in self.batch.models.values() if self.batch else (m for art in self.arts.values() for m in art.models.values()): m.bind()
    self.runners, self.bufs = {}, {}

  def slot(self) -> contextlib.AbstractContextManager[int]:
    """The slot a segment runs in while the context lasts (0 without a batch)."""
    return self.batch.slot() if self.batch else contextlib.nullcontext(0)

  def get(self, family: str, layouts: tuple, slot: int = 0):
    from modelrt.runner import DMRunner, RoadRunner
    from modelrt.batch import DMSlot, RoadSlot
    if (r := self.runners.get(key := (family, tuple(map(str, layouts)), slot))) is None:
      if self.batch is None: r = (RoadRunner if family == 'road' else DMRunner)(self.arts[family], *layouts)
      else:
        with self.batch.lock: r = (RoadSlot if family == 'road' else DMSlot)(self.batch, slot, *layouts)   # loads warps: tinygrad's
      r.set_threads(self.threads)
      self.runners[key] = r
    return r

  def buf(self, stream: int, layout, slot: int = 0):
    from modelrt.runner import HostBuf
    if (b := self.bufs.get(key := (stream, str(layout), slot))) is None: b = self.bufs[key] = HostBuf(layout, stream=stream, idx=0)
    return b

def replay_segment(src: str, out: str, runners: Runners, slot: int = 0) -> dict:
  """Run segment src through the daemons' frame models; returns its counts. Frames go into host buffers of a layout the
  artifacts were built for, the recorded messages into a SubMaster without sockets; what a daemon publishes for a frame
  is taken in from the next frame on, as the daemons see each other's outputs (modeld reads dmonitoringd's isRHD).
  slot: the runners' slot it runs in (Runners.slot)."""
  from cereal import messaging
  from cereal.services import ANSWERS, CAMERA_STATE_SERVICES, CAMERAS, STREAM_OF_STATE, road_streams
  from camerad.sources import LogSource
  from camerad.frames import FrameWriter, camera_state
  from modelrt.artifact import stream_layouts
  from service import Stats
  from dmonitoringd.model import DriverModel
  from modeld.model import RoadModel
  from msgq.visionipc import DRIVER
  from oproute.logreader import LogReader, segment_log
  from oproute.video import ENCODE_IDX_OF, VideoError
  from oproute.writer import LogFile, init_data
  t0 = time.monotonic()
  source = LogSource([src], decode_threads=runners.threads)   # a worker keeps to its cores (--threads): the job scales by workers
  # a camera without its video file runs without its model (openpilot writes dcamera.hevc only with RecordFront on);
  # one whose file is there but cannot be served is a damaged segment
  if damaged := {c: why for c, why in source.unserved.items() if (Path(src) / CAMERAS[c].video).exists()}:
    raise VideoError("; ".join(f"{c}: {why}" for c, why in damaged.items()))
  layouts = stream_layouts(runners.arts, source.streams)
  stats = Stats(log, interval=math.inf)
  sm = messaging.SubMaster(sorted(set(RoadModel.SUBSCRIBES) | set(DriverModel.SUBSCRIBES)), addr=None)
  road = (streams := road_streams(set(layouts))) and RoadModel(runners.get('road', tuple(layouts[s] for s in streams), slot), streams[0], sm, stats, log)
  dm = DRIVER in layouts and DriverModel(runners.get('dm', (layouts[DRIVER],), slot), sm, stats, log)
  final = Path(out)
  remove_temp_outputs(final)
  (tmp := final.parent / f".{final.name}.{uuid.uuid4().hex[:8]}.tmp").mkdir(parents=True)
  for c in CAMERAS.values():
    if (v := Path(src) / c.video).is_file(): os.symlink(v.resolve(), tmp / c.video)
  # the output is on the source's clock, as the EncodeIdx events it copies: each frame's camera states and outputs at
  # the time its camera state was recorded, initData at the segment's start. So the output spans the source segment's
  # time and lines up with it (plots, overlays), whenever and however fast the batch ran.
  # recorded: (stream, frame id, start of frame) -> logMonoTime of its camera state (a camera restarted in the segment
  # numbers its frames from 0 again: the start-of-frame time tells the two apart)
  recorded, encode_idx, t_start = {}, [], None
  for dat, ev in LogReader(segment_log(Path(src), "a")).raw():
    t_start = ev.logMonoTime if t_start is None else min(t_start, ev.logMonoTime)
    if (w := ev.which()) in ENCODE_IDX_OF: encode_idx.append(dat)
    elif (s := STREAM_OF_STATE.get(w)) is not None: recorded[s, getattr(ev, w).frameId, getattr(ev, w).timestampSof] = ev.logMonoTime
  init = messaging.log_from_bytes(init_data()).as_builder()
  init.logMonoTime = t_start
  rlog = LogFile(tmp / "rlog.zst")
  for dat in (init.to_bytes(), *encode_idx): rlog.write(dat)
  writer, bufs = FrameWriter(source, lockstep=True), {s: runners.buf(s, l, slot) for s, l in layouts.items()}
  frames, invalid, model_s, last, pending, served = 0, 0, 0., {}, [], dict.fromkeys(layouts, 0)
  for tick in source.ticks():
    evs = [messaging.log_from_bytes(dat) for svc, dat in tick.msgs if svc in sm.data] + pending
    sm.update_msgs(time.monotonic(), [ev for ev in evs if ev.which() in sm.data])
    pending = []
    if not tick.frames or not (sent := writer.write(tick, {s: (bufs[s].data, layouts[s]) for s in tick.frames})): continue
    for s, (fid, sof, eof) in sent.items():
      served[s] += 1
      last[s] = Frame(bufs[s], fid, sof, eof)
    t = {s: recorded[s, tick.states[s].frameId, tick.states[s].timestampSof] for s in sent}
    msgs = [(svc, camera_state(svc, fid, tick.index, sof, eof, 0., source.sensor[s], tick.states[s]), t[s])
            for s, (fid, sof, eof) in sent.items() for svc in [CAMERA_STATE_SERVICES[s]]]
    if road and streams[0] in sent:
      msgs += [(svc, m, t[streams[0]]) for svc, m in road.step(*(last.get(s, last[streams[0]]) for s in (streams[0], streams[-1])))]
    if dm and DRIVER in sent: msgs += [(svc, m, t[DRIVER]) for svc, m in dm.step(last[DRIVER])]
    frame_invalid = False   # a frame counts once, however many of its outputs are invalid
    for svc, msg, msg_t in msgs:
      msg.logMonoTime = msg_t
      rlog.write(dat := msg.to_bytes())
      pending.append(ev := messaging.log_from_bytes(dat))
      if svc in ANSWERS:
        frame_invalid |= not ev.valid
        model_s += getattr(ev, svc).modelExecutionTime
    frames, invalid = frames + 1, invalid + frame_invalid
  rlog.close()
  if dead := [CAMERAS[c].video for c, cam in CAMERAS.items() if served.get(cam.stream) == 0]:
    raise VideoError(f"no frame of {', '.join(dead)} could be decoded ({'; '.join(source.skipped) or 'no reason given'})")
  counts = {"frames": frames, "invalid": invalid, "model_s": model_s, "wall_s": time.monotonic() - t0, "lost": sum(source.skipped.values()),
            "bad_output": stats.totals.get("bad_output", 0), "lost_why": dict(source.skipped),
            "unserved": {f"{cam}: {why}": 1 for cam, why in source.unserved.items()}}   # as in a lockstep replay of the segment
  (tmp / COUNTS).write_text(json.dumps(counts))
  if final.exists(): shutil.rmtree(final)
  os.rename(tmp, final)
  return counts

@ray.remote
class SegmentWorker:
  """Holds a worker's loaded artifacts and replays segments, as a daemon serves frames: one at a time, or with
  batch_frames > 1 that many side by side (an actor of as many threads: Ray's max_concurrency), their frames batched."""
  def __init__(self, artifacts: str, threads: int = 1, device: str | None = None, batch_frames: int = 1):
    private_umask()   # a cluster's worker writes the outputs too
    self.runners = Runners(artifacts, threads, device, batch_frames)

  def where(self) -> str:
    """Its process and node: answered once the artifacts are loaded."""
    return f"pid {os.getpid()} on {ray.util.get_node_ip_address()}"

  def replay(self, job: dict) -> dict:
    try:
      with self.runners.slot() as slot: return replay_segment(job["src"], job["out"], self.runners, slot)
    except Exception as e:   # a corrupt or unreadable segment: reported, its temporary output removed, the next one served
      log.error("%s: %s", job["src"], traceback.format_exc())
      remove_temp_outputs(Path(job["out"]))
      return {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"}
