"""modeld-record as a real process over real pub/sub, and LogReader on what it wrote (and on damaged files)."""
import bz2, gc, io, json, os, re, signal, subprocess, sys, time
from pathlib import Path
import pytest
import zstandard as zstd
from cereal import messaging
from cereal.services import SERVICES
from tests.daemon_harness import Notify
from oproute.logreader import CompressedDataError, LogReader, LogStream, UnknownEvent, decompressed, log_files, segment_dirs
from oproute.writer import LogFile

LOG_NAME = "rlog.zst"

def read_log_file(path: Path) -> tuple[bytes, str | None]:
  """The decompressed bytes of a log file, and what ended them early (damaged or cut compressed data)."""
  out = []
  with open(path, "rb") as f:
    try: out.extend(decompressed(f))
    except CompressedDataError as e: return b"".join(out), str(e)
  return b"".join(out), None

ROOT = Path(__file__).resolve().parents[1]

def start_recorder(*args: str) -> tuple[subprocess.Popen, Notify]:
  """modeld-record with a notify socket and a STATUS= per loop turn (its counts: Notify.wait_count); returns once it
  reported READY=1 (it has subscribed by then)."""
  notify = Notify()
  p = subprocess.Popen([sys.executable, "-m", "modeld_tools.record", "--stats-interval", "0", *map(str, args)], cwd=ROOT,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "NOTIFY_SOCKET": notify.addr})
  try: notify.wait("READY=1", 20)
  except TimeoutError:
    p.kill()
    notify.close()
    pytest.fail(f"modeld-record did not get ready: {p.communicate()[1]}")
  return p, notify

def car(i: int) -> bytes:
  msg = messaging.new_message("carState")
  msg.carState.vEgo = float(i)
  return msg.to_bytes()

def calib(i: int) -> bytes:
  msg = messaging.new_message("liveCalibration")
  msg.liveCalibration.rpyCalib = [0.0, 0.001 * i, 0.0]
  return msg.to_bytes()

def by_service(events) -> dict[str, list[bytes]]:
  out = {}
  for dat, ev in events: out.setdefault(ev.which(), []).append(dat)
  return out

def test_sigkill_loses_at_most_the_last_moments(tmp_path):
  """Messages across several segments; after a SIGKILL mid-segment every message sent before the last flush reads back
  byte-identical, the rest of what reads back is a prefix of what was sent, and closed segments read without warnings."""
  route = tmp_path / "route"
  pm = messaging.PubMaster(["carState", "liveCalibration"])   # up first: the recorder's subscriptions are live when ready
  p, notify = start_recorder("carState", "liveCalibration", "--route", route, "--segment-seconds", "0.3", "--flush-seconds", "0.1")
  try:
    sent = {"carState": [], "liveCalibration": []}
    def send(i: int):
      sent["carState"].append(car(i))
      pm.send("carState", sent["carState"][-1])
      if i % 10 == 0:
        sent["liveCalibration"].append(calib(i))
        pm.send("liveCalibration", sent["liveCalibration"][-1])
    for i in range(150):
      send(i)
      time.sleep(0.005)
    flushed, deadline = {s: len(v) for s, v in sent.items()}, time.monotonic() + 10
    while time.monotonic() < deadline:   # until a flush has put all of it on disk
      on_disk = by_service(LogReader(route).raw())
      if all(len(on_disk.get(s, [])) >= n for s, n in flushed.items()): break
      time.sleep(0.05)
    for i in range(150, 400):
      send(i)
      if i == 300: p.send_signal(signal.SIGKILL)
    p.wait(10)
  finally:
    if p.poll() is None: p.kill()
    pm.close()
    notify.close()
  segs = segment_dirs(route)
  assert len(segs) >= 3, f"expected several 0.3 s segments, got {[s.name for s in segs]}"
  for i, seg in enumerate(segs[:-1]):
    lr = LogReader(seg)
    assert next(iter(lr)).which() == "initData" and lr.warnings == [], f"segment {seg.name}: {lr.warnings}"
    if i < len(segs) - 2:   # closed (the one before the last may have been closing when the kill came)
      for log in ("rlog.zst", "qlog.zst"):   # one frame with its size: one-shot decoders (openpilot's LogReader) read it
        assert zstd.decompress((seg / log).read_bytes()) == read_log_file(seg / log)[0]
  got = by_service(LogReader(route).raw())
  for s, msgs in sent.items():
    assert got[s] == msgs[:len(got[s])], f"{s}: what reads back is not what was sent"
    assert len(got[s]) >= flushed[s], f"{s}: {len(got[s])} read back, {flushed[s]} were flushed before the kill"
  # the killed segment's logs are frames without their size; --finalize makes every log one-shot readable, same content
  def one_shot(f: Path) -> bool:
    try: return zstd.decompress(f.read_bytes()) is not None
    except zstd.ZstdError: return False
  unfinished = [seg / log for seg in segs for log in ("rlog.zst", "qlog.zst") if not one_shot(seg / log)]
  assert unfinished, "the segment open at the kill was left as the recorder writes it"
  for f in unfinished: os.utime(f, (time.time() - 60,) * 2)   # a crash a minute ago (a log written to just now is left alone)
  r = subprocess.run([sys.executable, "-m", "oproute", "--finalize", route], cwd=ROOT, capture_output=True, text=True, timeout=60)
  assert r.returncode == 0 and all(f"finalized {f}" in r.stdout for f in unfinished), r.stdout + r.stderr
  for seg in segs:
    for log in ("rlog.zst", "qlog.zst"): assert zstd.decompress((seg / log).read_bytes()) == read_log_file(seg / log)[0]
  assert by_service(LogReader(route).raw()) == got

def test_sigterm_closes_and_skips_malformed(tmp_path):
  """A clean stop closes the segment; a message that is not a whole Event of its service is not recorded (it would
  break the file's framing); events come back in time order across services."""
  route = tmp_path / "route"
  pm = messaging.PubMaster(["carState", "liveCalibration"])
  p, notify = start_recorder("carState", "liveCalibration", "--route", route)
  try:
    good = []
    for i in range(20):
      good.append(car(i) if i % 2 else calib(i))
      pm.send("carState" if i % 2 else "liveCalibration", good[-1])
      if i == 5: pm.send("carState", b"\x00\x00\x00\x00\xff\xff\x00\x00garbage")   # segment table claims more than it has
      if i == 7: pm.send("carState", calib(7))   # a whole Event, of the wrong service
      time.sleep(0.01)
    notify.wait_count("messages", len(good))   # the malformed two came before the last good one: counted by now
    assert notify.count("carState_malformed") == 2 and notify.count("liveCalibration_malformed") == 0, notify.messages[-1]
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=10)
    assert p.returncode == 0, err
  finally:
    if p.poll() is None: p.kill()
    pm.close()
    notify.close()
  lr = LogReader(route, sort_by_time=True)
  events = list(lr.raw())
  assert events[0][1].which() == "initData" and [d for d, _ in events[1:]] == good and lr.warnings == []
  # the qlog: initData, then every Nth message of each service (N: its decimation in the services table)
  qlog = [d for d, _ in LogReader(route, "q", sort_by_time=True).raw()]
  assert qlog[0] == events[0][0]
  want = [d for svc in ("carState", "liveCalibration") for d in [m for m in good if messaging.log_from_bytes(m).which() == svc][::SERVICES[svc].decimation]]
  assert sorted(qlog[1:]) == sorted(want)

def test_video_goes_on_after_camerad_restarts(tmp_path):
  """camerad restarted while modeld-record records its video: the new camerad numbers its frames from 0 again, and
  they are recorded from then on (a new camera session), not dropped until the ids pass the old camerad's last."""
  from tests.artifacts import LAYOUT
  scene = tmp_path / "scene.json"
  scene.write_text(json.dumps({"frames": 20, "intrinsics": {"road": {"width": LAYOUT.width, "height": LAYOUT.height, "focal_length": 88.0}}}))
  def camerad(fps: int) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "camerad", "--source", f"synthetic:{scene}", "--cameras", "road", "--loop", "--fps", str(fps)],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
  route, cams = tmp_path / "route", [camerad(100)]   # fast: its frame ids are far ahead when it stops
  p, notify = start_recorder("--route", route, "--video", "road", "roadCameraState")
  try:
    notify.wait_count("roadEncodeIdx", 60, timeout=30)
    cams[0].send_signal(signal.SIGTERM)
    assert cams[0].wait(10) == 0, cams[0].communicate()[1]
    before = notify.count("roadEncodeIdx")
    cams.append(camerad(20))
    notify.wait_count("roadEncodeIdx", before + 10, timeout=30)   # some are the old camerad's last: the encoder lags a frame or two
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=20)
    assert p.returncode == 0, err
    assert notify.count("road_video_out_of_order") == 0, notify.messages[-1]
  finally:
    for q in (p, *cams):
      if q.poll() is None: q.kill()
      q.communicate()
    notify.close()
  ids = [ev.roadEncodeIdx.frameId for ev in LogReader(route) if ev.which() == "roadEncodeIdx"]
  starts = [i for i in range(1, len(ids)) if ids[i] <= ids[i - 1]]
  assert len(starts) == 1, ids   # one restart, each session's ids increasing
  first, second = ids[:starts[0]], ids[starts[0]:]
  assert len(first) >= 60 and len(second) >= 5 and second[0] < first[-1] - 30, (first, second)

def test_video_frames_the_recorder_got_to_too_late_are_counted_behind(tmp_path):
  """A burst of frames into 2 buffers, far faster than they encode: the recorder gets to most after camerad reused their
  buffer. Those are counted `behind`, not copied and not recorded; every frame recorded holds its own picture (lossless
  video, each frame a different grey), and each frame is recorded, behind or torn, never two of these."""
  import av
  from cereal.services import CAMERAS
  from msgq.visionipc import ROAD, VisionIpcServer
  n, route = 40, tmp_path / "route"
  server = VisionIpcServer("camerad")
  server.create_buffers(ROAD, 2, 320, 240)
  server.start_listener()
  p, notify = start_recorder("--route", route, "--video", "road", "--lossless", "carState")
  try:
    notify.wait_count("video_connected", 1)
    for i in range(n):
      buf = server.get_free_buffer(ROAD)
      buf.array[:] = 128
      buf.array[:buf.uv_offset] = 5 * i
      server.publish(ROAD, buf, i)
    notify.wait_count("road_video_behind", 1)
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=30)
    assert p.returncode == 0, err
    behind, torn = notify.count("road_video_behind"), notify.count("road_video_torn")
  finally:
    if p.poll() is None: p.kill()
    notify.close()
    server.close()
  ids = [ev.roadEncodeIdx.frameId for ev in LogReader(route) if ev.which() == "roadEncodeIdx"]
  with av.open(str(route / f"{route.name}--0" / CAMERAS["road"].video)) as c:
    greys = [round(float(f.to_ndarray(format="yuv420p")[:240].mean())) for f in c.decode(video=0)]   # the Y plane
  assert ids == sorted(set(ids)) and len(ids) + behind + torn <= n and behind >= n // 2, (ids, behind, torn)
  assert greys == [5 * i for i in ids], (greys, ids)

def write_log(path: Path, msgs: list[bytes], flush_every: int = 7, close: bool = True) -> None:
  """A log as the recorder writes it: zstd frames ended every few messages; closed (one frame) or as a crash leaves it."""
  w = LogFile(path)
  for i, m in enumerate(msgs):
    w.write(m)
    if i % flush_every == flush_every - 1: w.flush()
  if close: w.close()
  else:
    w.flush()
    w.f.close()

def test_truncated_tail_reads_up_to_last_whole_message(tmp_path):
  msgs = [car(i) for i in range(40)]
  path = tmp_path / LOG_NAME
  write_log(path, msgs)
  assert [d for d, _ in LogReader(path).raw()] == msgs
  # content cut in the middle of message 25 (as a crash mid-write leaves it), compressed as a valid zstd stream
  content, problem = read_log_file(path)
  assert content == b"".join(msgs) and problem is None
  cut = sum(map(len, msgs[:25])) + len(msgs[25]) // 2
  path.write_bytes(zstd.ZstdCompressor().compress(content[:cut]))
  lr = LogReader(path)
  assert [d for d, _ in lr.raw()] == msgs[:25]
  assert len(lr.warnings) == 1 and "not a whole message" in lr.warnings[0] and f"from offset {cut - len(msgs[25]) // 2}" in lr.warnings[0]
  # the compressed file itself cut anywhere, closed (one frame) or as a crash leaves it (frames): what decodes comes back,
  # and the cut is named: the file, how much decoded, where the frame it fell in starts
  for close in (True, False):
    write_log(path, msgs, close=close)
    data = path.read_bytes()
    for n in (len(data) - 1, len(data) - 5, len(data) * 2 // 3, len(data) // 3, 10):
      path.write_bytes(data[:n])
      lr = LogReader(path)
      got = [d for d, _ in lr.raw()]
      assert got == msgs[:len(got)], (close, n)
      want = f"{path}: compressed data ends early after {len(read_log_file(path)[0])} bytes: the zstd frame at byte "
      assert lr.warnings and lr.warnings[0].startswith(want), (close, n, lr.warnings)
  path.write_bytes(b"")   # a log the crash left empty: nothing to read, nothing lost
  lr = LogReader(path)
  assert list(lr) == [] and lr.warnings == []

def test_zstd_log_cut_inside_a_frame(tmp_path):
  """zstd's streaming reader returns the same bytes for a file cut inside a frame as for a whole one: the cut must be
  found anyway. A log of frames (a crash's) cut by one byte: the frames before it all read, the warning names the file
  and the cut frame, `python -m oproute` exits 1 saying so and --finalize repairs it naming the loss. A closed log (one
  frame) cut short, as a partial copy leaves it: the same, though no event decodes, and camerad says why it has nothing."""
  msgs = [car(i) for i in range(40)]
  crashed = tmp_path / "crashed" / LOG_NAME
  crashed.parent.mkdir()
  w, starts = LogFile(crashed), []
  for i in range(0, len(msgs), 8):   # frames of 8 messages, as flushes leave them
    starts.append(crashed.stat().st_size)
    for m in msgs[i:i + 8]: w.write(m)
    w.flush()
  w.f.close()
  crashed.write_bytes(crashed.read_bytes()[:-1])
  lr = LogReader(crashed)
  got = [d for d, _ in lr.raw()]
  assert got == msgs[:len(got)] and len(got) >= 32, len(got)
  assert lr.warnings == [f"{crashed}: compressed data ends early after {len(b''.join(got))} bytes: the zstd frame at byte "
                         f"{starts[-1]} of the file is cut short"], lr.warnings
  closed = tmp_path / "closed" / LOG_NAME
  closed.parent.mkdir()
  write_log(closed, msgs[:4])
  closed.write_bytes(closed.read_bytes()[:-30])
  assert read_log_file(closed) == (b"", "compressed data ends early after 0 bytes: the zstd frame at byte 0 of the file is cut short")
  r = subprocess.run([sys.executable, "-m", "camerad", "--source", closed], cwd=ROOT, capture_output=True, text=True, timeout=60)
  assert r.returncode == 1 and f"{closed}: compressed data ends early after 0 bytes" in r.stderr, r.stderr   # why no camera state read
  for f, n in ((crashed, len(got)), (closed, 0)):
    r = subprocess.run([sys.executable, "-m", "oproute", f], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and f"{f}: compressed data ends early after " in r.stderr, r.stdout + r.stderr
    os.utime(f, (time.time() - 60,) * 2)   # cut a minute ago: not a log still being written
    r = subprocess.run([sys.executable, "-m", "oproute", "--finalize", f], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.startswith(f"finalized {f} (compressed data ends early after "), r.stdout + r.stderr
    lr = LogReader(f)
    assert [d for d, _ in lr.raw()] == msgs[:n] and lr.warnings == [] and zstd.decompress(f.read_bytes()) == b"".join(msgs[:n])

def test_finalize_repairs_what_a_crash_left(tmp_path):
  """python -m oproute --finalize on the logs a crash can leave: an empty one (the segment had just opened), a zstd
  header cut short, frames without their size ending in a partial message. Each becomes one zstd frame with its size
  (what one-shot readers need) holding the whole messages, and the damage is named; a closed log is left alone."""
  route, msgs = tmp_path / "r", [car(i) for i in range(3)]
  for n in range(5): (route / f"r--{n}").mkdir(parents=True)
  (route / "r--0" / LOG_NAME).write_bytes(b"")
  (route / "r--1" / LOG_NAME).write_bytes(zstd.ZstdCompressor().compress(msgs[0])[:3])
  with zstd.ZstdCompressor().stream_writer(open(route / "r--2" / LOG_NAME, "wb")) as w:
    w.write(b"".join(msgs))
    w.flush(zstd.FLUSH_FRAME)
    w.write(msgs[0][:20])
  write_log(route / "r--3" / LOG_NAME, msgs)
  write_log(route / "r--4" / LOG_NAME, msgs, close=False)   # still being recorded: written to just now
  closed, recording = (route / "r--3" / LOG_NAME).read_bytes(), (route / "r--4" / LOG_NAME).read_bytes()
  for n in range(4): os.utime(route / f"r--{n}" / LOG_NAME, (time.time() - 60,) * 2)
  r = subprocess.run([sys.executable, "-m", "oproute", "--finalize", route], cwd=ROOT, capture_output=True, text=True, timeout=60)
  assert r.returncode == 0, r.stderr
  assert [l for l in r.stdout.splitlines() if l.startswith(("finalized", "left"))] == [
    f"finalized {route / 'r--0' / LOG_NAME}", f"finalized {route / 'r--1' / LOG_NAME} (3 bytes of a partial message at the end dropped)",
    f"finalized {route / 'r--2' / LOG_NAME} (20 bytes of a partial message at the end dropped)"] + \
    [l for l in r.stdout.splitlines() if l.startswith(f"left {route / 'r--4' / LOG_NAME} alone: written to ")], r.stdout
  assert [zstd.decompress((route / f"r--{n}" / LOG_NAME).read_bytes()) for n in range(3)] == [b"", b"", b"".join(msgs)]
  assert (route / "r--3" / LOG_NAME).read_bytes() == closed and (route / "r--4" / LOG_NAME).read_bytes() == recording
  r = subprocess.run([sys.executable, "-m", "oproute", f"{route}/0:4:0"], cwd=ROOT, capture_output=True, text=True, timeout=60)
  assert r.returncode == 1 and r.stderr == f"python -m oproute: {route}/0:4:0: not a segment range (slice step cannot be zero)\n", r.stderr

def test_log_stream_framing():
  msgs = [car(1), calib(2), car(3)]
  blob, offsets = b"".join(msgs), [0, len(msgs[0]), len(msgs[0]) + len(msgs[1])]
  def read(data: bytes) -> tuple[list, LogStream]:
    s = LogStream(io.BytesIO(data))
    return list(s), s
  got, s = read(blob)
  assert got == list(zip(offsets, msgs)) and s.problems() == [] and s.messages == 3
  got, s = read(blob[:-3])
  assert got == list(zip(offsets, msgs))[:2] and s.rest == len(msgs[2]) - 3 and s.problem is None
  assert s.problems() == [f"{len(msgs[2]) - 3} bytes from offset {offsets[2]} are not a whole message (cut short, or not a log); "
                          "read the 2 messages before them"]
  got, s = read(b"\xff\xff\xff\xff" + blob)   # implausible segment count: no message, and nothing read after it
  assert got == [] and s.problems() == ["not a log from offset 0: a segment table of 4294967296 segments (a message has at most 512); "
                                        "read the 0 messages before it"]

def test_compressions_bad_bytes_and_unknown_events(tmp_path):
  """zstd, bzip2 and plain logs read alike; bytes that are not an Event are reported with file and offset, never
  yielded; an event of a union member this schema does not know comes out as unknown, never as another type."""
  msgs = [car(i) for i in range(5)]
  for name, data in (("rlog.zst", zstd.ZstdCompressor().compress(b"".join(msgs))), ("rlog.bz2", bz2.compress(b"".join(msgs))), ("rlog", b"".join(msgs))):
    (tmp_path / name).write_bytes(data)
    assert [d for d, _ in LogReader(tmp_path / name).raw()] == msgs, name
    assert [d for d, _ in LogReader.from_bytes(data).raw()] == msgs, name   # the bytes of a file, as openpilot's
  cut = LogReader.from_bytes(zstd.ZstdCompressor().compress(b"".join(msgs))[:-3])
  got = [d for d, _ in cut.raw()]
  assert got == msgs[:len(got)] and cut.warnings[0].startswith("<bytes>: compressed data ends early")
  # a newer openpilot's member: the Event's union discriminant (its first data word, bits 32..47) set past this schema's
  newer = car(9)
  words = bytearray(newer)   # one segment: an 8-byte segment table, the root pointer, then the Event's data section
  disc_at = 8 + 8 + 2 * messaging.log.Event.schema.node.struct.discriminantOffset
  assert int.from_bytes(words[disc_at:disc_at + 2], "little") == messaging.log.Event.schema.fields["carState"].proto.discriminantValue
  words[disc_at:disc_at + 2] = (999).to_bytes(2, "little")
  garbage = b"\x07\x00\x00\x00" + b"\xff" * 60   # claims 8 segments that are not there
  (tmp_path / "rlog").write_bytes(msgs[0] + bytes(words) + msgs[1] + garbage)
  lr = LogReader(tmp_path / "rlog")
  evs = list(lr)
  assert [ev.which() for ev in evs] == ["carState", "unknown", "carState"] and isinstance(evs[1], UnknownEvent)
  assert evs[1].logMonoTime == messaging.log_from_bytes(newer).logMonoTime and evs[1].data == bytes(words)
  assert len(lr.warnings) == 1 and f"offset {len(msgs[0]) * 2 + len(words)}" in lr.warnings[0] and str(tmp_path / "rlog") in lr.warnings[0]
  assert [ev.which() for ev in LogReader(tmp_path / "rlog", only_union_types=True)] == ["carState", "carState"]

def test_logreader_paths(tmp_path):
  route = tmp_path / "r"
  for n, msgs in enumerate([[car(1), car(2)], [car(3)], [car(4), car(5)]]):
    (route / f"r--{n}").mkdir(parents=True)
    write_log(route / f"r--{n}" / LOG_NAME, msgs)
  (route / "r--10").mkdir()   # a segment folder without a log (e.g. only video) is not a segment
  assert [d.name for d in segment_dirs(route)] == ["r--0", "r--1", "r--2"]
  evs = list(LogReader(route))   # events kept once the reader moved on: each keeps its own bytes
  gc.collect()
  assert [ev.carState.vEgo for ev in evs] == [1, 2, 3, 4, 5]
  assert [ev.carState.vEgo for ev in LogReader(route / "r--2")] == [4, 5]
  assert [ev.carState.vEgo for ev in LogReader(route / "r--1" / LOG_NAME)] == [3]
  plain = tmp_path / "rlog"
  plain.write_bytes(car(7) + car(8))
  assert [ev.carState.vEgo for ev in LogReader(plain)] == [7, 8]
  assert [ev.carState.vEgo for ev in LogReader([route / "r--2", plain])] == [4, 5, 7, 8]
  # a device's layout: the segments of route R side by side, named by the route
  for n, v in enumerate((11, 12)):
    (tmp_path / "realdata" / f"R--{n}").mkdir(parents=True)
    write_log(tmp_path / "realdata" / f"R--{n}" / LOG_NAME, [car(v)])
  assert [x.vEgo for x in LogReader(tmp_path / "realdata" / "R").filter("carState")] == [11, 12]
  assert LogReader(tmp_path / "realdata" / "R").first("carState").vEgo == 11
  # qlogs: mode q reads them, mode a where there is no rlog
  write_log(route / "r--1" / "qlog.zst", [car(30)])
  assert [ev.carState.vEgo for ev in LogReader(route / "r--1", "q")] == [30]
  (route / "r--1" / LOG_NAME).unlink()
  assert [ev.carState.vEgo for ev in LogReader(route, "a")] == [1, 2, 30, 4, 5]
  with pytest.raises(FileNotFoundError, match="no rlog.zst/rlog.bz2/rlog in segment.* r--1"): LogReader(route)
  with pytest.raises(FileNotFoundError, match="no such log, segment or route"): log_files(tmp_path / "nope" / "x")
  (tmp_path / "empty").mkdir()
  with pytest.raises(FileNotFoundError, match="expected a log file, a segment folder"): LogReader(tmp_path / "empty")

def speeds(lr) -> list[float]: return [ev.carState.vEgo for ev in lr]   # for run_across_segments: a function its processes can import

def test_logreader_openpilot_identifiers(tmp_path):
  """openpilot's ways to name what to read: segment ranges and modes after a route (`ROUTE/1:3/q`, `ROUTE--1:3`),
  ReadMode, a folder holding several routes (read route by route), run_across_segments, reset."""
  from oproute import ReadMode
  route = tmp_path / "r"
  for n in range(4):
    (route / f"r--{n}").mkdir(parents=True)
    write_log(route / f"r--{n}" / LOG_NAME, [car(n)])
    write_log(route / f"r--{n}" / "qlog.zst", [car(10 + n)])
  v = lambda lr: [ev.carState.vEgo for ev in lr]
  assert v(LogReader(f"{route}/2")) == [2] and v(LogReader(f"{route}/-1")) == [3] and v(LogReader(f"{route}/1:3")) == [1, 2]
  assert v(LogReader(f"{route}/::2/q")) == [10, 12] and v(LogReader(f"{route}/q")) == [10, 11, 12, 13]
  assert v(LogReader(f"{route}/:2", ReadMode.QLOG)) == [10, 11] and v(LogReader(f"{route}/:2/r", "q")) == [0, 1]
  # the range after `--` as well (a segment's name when one number): ROUTE--2, ROUTE--1:3/q, ROUTE---1 (the last)
  assert v(LogReader(f"{route}--2")) == [2] and v(LogReader(f"{route}--1:3/q")) == [11, 12] and v(LogReader(f"{route}---1")) == [3]
  # a segment, or range, the route does not have is an error naming those it has, never a silent shorter read
  for ident, missing in (("/7", "segment 7"), ("--7", "segment 7"), ("/-5", "segment -5"), ("/0:9", "segments 4, 5, 6, 7, 8"),
                         ("--2:6", "segments 4, 5")):
    with pytest.raises(FileNotFoundError, match=rf"^{re.escape(f'{route}{ident}')}: no {missing} \(the route has 0, 1, 2, 3\)$"): LogReader(f"{route}{ident}")
  with pytest.raises(FileNotFoundError, match=r"/5:: the range names no segment \(the route has 0, 1, 2, 3\)$"): LogReader(f"{route}/5:")
  assert v(LogReader(f"{route}/2:")) == [2, 3] and v(LogReader(f"{route}/-3:9")) == [1, 2, 3]   # open or relative: what exists
  (route / "r--1" / LOG_NAME).unlink()
  assert v(LogReader(route, ReadMode.AUTO_INTERACTIVE)) == v(LogReader(f"{route}/a")) == [0, 11, 2, 3]
  with pytest.raises(ValueError, match="default_mode must be one of"): LogReader(route, "x")
  assert LogReader(route, "a").run_across_segments(2, speeds, disable_tqdm=True) == [0, 11, 2, 3]
  lr = LogReader(route, "a")
  (route / "r--4").mkdir()
  write_log(route / "r--4" / LOG_NAME, [car(4)])
  assert v(lr) == [0, 11, 2, 3] and (lr.reset(), v(lr))[1] == [0, 11, 2, 3, 4]   # a route still being recorded has grown
  # a device's realdata/: two routes' segments side by side are read route by route, never interleaved by number
  dev = tmp_path / "realdata"
  for name, n, x in (("B", 0, 20), ("A", 1, 31), ("A", 0, 30), ("B", 1, 21)):
    (dev / f"{name}--{n}").mkdir(parents=True)
    write_log(dev / f"{name}--{n}" / LOG_NAME, [car(x)])
  assert [d.name for d in segment_dirs(dev)] == ["A--0", "A--1", "B--0", "B--1"] and v(LogReader(dev)) == [30, 31, 20, 21]
  assert v(LogReader(dev / "B")) == [20, 21] and v(LogReader(f"{dev}/B/1")) == [21]
  assert v(LogReader(f"{dev}/B--1")) == [21] and v(LogReader(f"{dev}/B--0:2")) == [20, 21]   # a segment folder as it is; a range
  with pytest.raises(ValueError, match="holds 2 routes .A, B.: a segment range needs one route"): LogReader(f"{dev}/0")

def test_record_cli_errors(tmp_path):
  def run(*args):
    return subprocess.run([sys.executable, "-m", "modeld_tools.record", *map(str, args)], cwd=ROOT, capture_output=True, text=True, timeout=30)
  r = run("notAService")
  assert r.returncode == 2 and "unknown services ['notAService']" in r.stderr
  r = run("--video", "rear")
  assert r.returncode == 2 and "--video" in r.stderr
  r = run("--lossless")
  assert r.returncode == 2 and "--lossless: applies to --video only" in r.stderr
  for args, msg in ((["--seconds", "0"], "--seconds: expected S > 0, got 0.0"), (["--stats-interval", "-1"], "--stats-interval: expected S >= 0, got -1.0"),
                    (["--log-level", "loud"], "invalid choice: 'LOUD'")):
    r = run(*args)
    assert r.returncode == 2 and msg in r.stderr and "Traceback" not in r.stderr, (args, r.stderr)
  (tmp_path / "r" / "r--0").mkdir(parents=True)
  r = run("--route", tmp_path / "r", "--seconds", "0.1")
  assert r.returncode == 1 and "already has segments" in r.stderr
  r = run("--help")
  assert r.returncode == 0 and "--segment-seconds" in r.stdout and "--flush-seconds" in r.stdout

def test_records_services_outside_the_table_to_the_rlog(tmp_path):
  """camerad republishes every Event member a route holds, openpilot's controlsState included: modeld-record takes
  any such name and writes its messages, byte for byte, to the rlog (the qlog keeps the services table's only)."""
  from tests import openpilot_ref as op
  sent = [op.log.Event.new_message(logMonoTime=i, valid=True, controlsState={"curvature": 0.01 * i}).to_bytes() for i in range(5)]
  pub = messaging.pub_sock("controlsState")
  p, notify = start_recorder("controlsState", "carState", "--route", tmp_path / "route")
  try:
    for dat in sent: pub.send(dat)
    notify.wait_count("controlsState", 5, 20)
  finally:
    p.send_signal(signal.SIGINT)
    p.communicate(timeout=30)
    notify.close()
    pub.close()
  assert p.returncode == 0
  assert by_service(LogReader(tmp_path / "route", "r").raw()).get("controlsState") == sent
  assert "controlsState" not in by_service(LogReader(tmp_path / "route", "q").raw())
