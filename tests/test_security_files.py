"""Hostile files: every reader of routes, logs and videos as a real process on a decompression bomb and other garbage
(refused naming the file and where, in bounded memory: peak RSS of the reader measured by the kernel), and recordings
that belong to their user alone (0700/0600 whatever the umask, symlinks and other accounts' paths refused by name)."""
import bz2, os, re, resource, stat, struct, subprocess, sys, tempfile
from fractions import Fraction
from pathlib import Path
import av, numpy as np, pytest
import zstandard as zstd
from cereal import messaging
from oproute.logreader import MAX_MESSAGE
from oproute.video import MAX_NALS, HevcWriter
from oproute.writer import LogFile, RouteWriter, finalize
from service.owned import NotOwnedError
from tests.accounts import nobody_uid
from tests.openpilot_route import write_route

ROOT = Path(__file__).resolve().parents[1]
GIB = 1 << 30
MAX_RSS_MB = 300   # the bound on a reader's peak memory for a 1 GiB bomb
GUARD = 8 * GIB    # address space a reader may take: the old readers' 9 GiB would take the machine down before failing

# Launches a reader and reports its exit code and peak RSS. A process's peak RSS counts, from its exec, the memory of the
# process it was forked from (Linux keeps the old mm's high-water mark): from the test process, grown by the suite, every
# reader would count hundreds of MB it never had. Forked from this small launcher instead, it counts the launcher's.
LAUNCHER = """import os, resource, sys
resource.setrlimit(resource.RLIMIT_AS, (int(sys.argv[2]),) * 2)
if (pid := os.fork()) == 0: os.execv(sys.argv[3], sys.argv[3:])
_, status, usage = os.wait4(pid, 0)
with open(sys.argv[1], "w") as f: f.write(f"{os.waitstatus_to_exitcode(status)} {usage.ru_maxrss}")"""

def run_reader(*args, timeout: float = 60) -> tuple[int, str, int]:
  """(exit code, stdout and stderr, peak RSS in MB) of a reader run as a real process under an address-space guard: the
  kernel's count of it (and of what it waited for), from wait4."""
  with tempfile.TemporaryDirectory() as d, open(out := os.path.join(d, "out"), "wb") as f:
    p = subprocess.Popen([sys.executable, "-c", LAUNCHER, usage := os.path.join(d, "usage"), str(GUARD), sys.executable, *map(str, args)],
                         cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
    try: p.wait(timeout)
    except subprocess.TimeoutExpired:   # a hang: ended here, and the test fails saying so
      os.killpg(p.pid, 9)
      p.wait()
    text = open(out, "rb").read().decode(errors="replace")
    try: rc, kb = map(int, open(usage).read().split())
    except (OSError, ValueError): rc, kb = -9, 0
  if rc == -9: pytest.fail(f"{' '.join(map(str, args))}: killed after {timeout} s (or by the kernel): {text[-2000:]}")
  return rc, text, kb // 1024

def event(which: str, t: int) -> bytes:
  msg = messaging.new_message(which, logMonoTime=t)
  return msg.to_bytes()

def frames_of(content: bytes, total: int, compress) -> bytes:
  """total bytes of content repeated (len(content) must divide it), as back-to-back frames or streams of one content
  each: a 1 GiB stream in a file of a few KiB, made at once."""
  return compress(content) * (total // len(content))

MIB_OF_ZEROS = bytes(1 << 20)
ONE_WORD = struct.pack("<II", 0, 1)   # a segment table: one segment of one word
BOMBS = {   # name -> (file name, its bytes or a size of sparse zeros, what the refusal says, at which offset)
  "zstd zeros": ("rlog.zst", frames_of(MIB_OF_ZEROS, GIB, zstd.compress), "first segment is empty", 0),
  "bzip2 zeros": ("rlog.bz2", frames_of(MIB_OF_ZEROS, GIB, bz2.compress), "first segment is empty", 0),
  "plain zeros": ("rlog", GIB, "first segment is empty", 0),
  "empty structs": ("rlog.zst", frames_of((ONE_WORD + struct.pack("<Q", 0xFFFFFFFC)) * (1 << 16), GIB, zstd.compress), "a root that is no Event", 0),
  "structs out of bounds": ("rlog.zst", frames_of((ONE_WORD + struct.pack("<Q", 1000 << 2 | 2 << 32)) * (1 << 16), GIB, zstd.compress),
                            "a message that is no Event", 0),
}

def write_bomb(path: Path, content: bytes | int) -> None:
  if isinstance(content, int):
    with open(path, "wb") as f: f.truncate(content)   # sparse: no disk taken
  else: path.write_bytes(content)

@pytest.fixture(scope="module")
def bomb_route(tmp_path_factory) -> Path:
  """A route of one segment whose rlog.zst decompresses to 1 GiB of zeros."""
  seg = tmp_path_factory.mktemp("bomb") / "bomb" / "bomb--0"
  seg.mkdir(parents=True)
  write_bomb(seg / "rlog.zst", BOMBS["zstd zeros"][1])
  return seg.parent

READERS = {
  "python -m oproute": lambda route, tmp: ["-m", "oproute", route],
  "camerad": lambda route, tmp: ["-m", "camerad", "--source", route],
  "modeld-replay": lambda route, tmp: ["-m", "modeld_tools.replay", route, "--artifacts", tmp / "unused", "--out", tmp / "out"],
  "modeld-view": lambda route, tmp: ["-m", "modeld_tools.view", route, "--save", tmp / "view.rrd"],
}

@pytest.mark.parametrize("reader", READERS)
def test_bomb_against_each_reader(reader, bomb_route, tmp_path):
  """A 32 KiB rlog.zst of 1 GiB of zeros: each reader exits non-zero, naming the file and the offset where it is no
  log, in bounded memory (the old readers decompressed all of it, then listed every 8-byte 'message': 9 GiB)."""
  rc, out, rss = run_reader(*READERS[reader](bomb_route, tmp_path))
  print(f"{reader}: exit {rc}, peak RSS {rss} MB")
  assert rss < MAX_RSS_MB, f"{reader}: peak RSS {rss} MB"
  assert rc != 0 and f"{bomb_route / 'bomb--0' / 'rlog.zst'}: not a log from offset 0: " in out, out[-3000:]

def test_bomb_against_modeld_batch(bomb_route, tiny_artifacts, tmp_path):
  """modeld-batch's worker refuses the bomb's segment, naming the file and offset in the summary, and the run exits 1
  (its worker, a Ray actor, is not this test's child: its memory is the same reader's as camerad's, measured above)."""
  def limit() -> None: resource.setrlimit(resource.RLIMIT_DATA, (GUARD, GUARD))   # Ray maps its object store: no RLIMIT_AS
  r = subprocess.run([sys.executable, "-m", "modeld_batch", bomb_route, "--artifacts", tiny_artifacts, "--out", tmp_path / "out", "--workers", "1",
                      "--quiet"], cwd=ROOT, capture_output=True, text=True, timeout=300, preexec_fn=limit)
  summary = (tmp_path / "out" / "summary.json").read_text()
  assert r.returncode == 1 and "rlog.zst: not a log from offset 0: " in summary, r.stdout + r.stderr + summary

@pytest.mark.parametrize("bomb", [b for b in BOMBS if b != "zstd zeros"])
def test_garbage_log_is_refused_at_its_offset(bomb, tmp_path):
  """The other bombs (bzip2, plain, messages that are no Event, 1 GiB each) through python -m oproute: refused at
  the first message, in bounded memory."""
  name, content, why, offset = BOMBS[bomb]
  write_bomb(path := tmp_path / name, content)
  rc, out, rss = run_reader("-m", "oproute", path)
  assert rss < MAX_RSS_MB, f"{bomb}: peak RSS {rss} MB"
  assert rc == 1 and f"{path}: not a log from offset {offset}: " in out and why in out, out[-3000:]

def test_random_bytes_truncated_and_too_large_messages(tmp_path):
  """A plain log of 1 GiB starting with a MiB of random bytes, a log whose 1 GiB of zeros after two events ends in a
  zstd frame cut short, and a plain log whose message after one event declares 2 GiB: each read up to where it stops
  being a log, which is named with its offset, in bounded memory (the old reader held each file whole)."""
  first = event("carState", 1) + event("carState", 2)
  cases = {
    "random": ("rlog", os.urandom(1 << 20), "a segment table of|over the cap", 0),
    "cut bomb": ("rlog.zst", zstd.compress(first) + frames_of(MIB_OF_ZEROS, GIB, zstd.compress)[:-8], "first segment is empty", len(first)),
    "too large": ("rlog", first[:len(first) // 2] + struct.pack("<II", 0, 1 << 28), "over the cap of 16777216 bytes", len(first) // 2),
  }
  for name, (log, content, why, offset) in cases.items():
    path = tmp_path / name / log
    path.parent.mkdir()
    path.write_bytes(content)
    if log == "rlog":
      with open(path, "r+b") as f: f.truncate(GIB)   # 1 GiB: what follows, sparse zeros (the declared message, as far as the file goes)
    rc, out, rss = run_reader("-m", "oproute", path)
    assert rss < MAX_RSS_MB, f"{name}: peak RSS {rss} MB"
    assert rc == 1 and f"{path}: not a log from offset {offset}: " in out and re.search(why, out), (name, out[-3000:])
  assert MAX_MESSAGE == 16 << 20

# ---- videos

def hevc(width: int, height: int, frames: int) -> bytes:
  """A raw HEVC stream of grey frames, as the recorder writes them."""
  out = tempfile.TemporaryFile()
  c = av.open(out, "w", format="hevc")
  st = c.add_stream("libx265", rate=Fraction(20))
  st.width, st.height, st.pix_fmt = width, height, "yuv420p"
  st.codec_context.options = {"preset": "ultrafast", "x265-params": "log-level=error:bframes=0:pools=none"}
  f = av.VideoFrame(width, height, "yuv420p")
  for p in f.planes: np.frombuffer(p, np.uint8)[:] = 128
  for i in range(frames):
    f.pts = i
    for pk in st.encode(f): c.mux(pk)
  for pk in st.encode(): c.mux(pk)
  c.close()
  out.seek(0)
  return out.read()

def declaring(stream: bytes, width: int, height: int) -> bytes:
  """stream with its SPS rewritten to declare width x height (the slices stay those of the small picture)."""
  nal = re.search(rb"\x00\x00\x01(\x42\x01.*?)(?=\x00\x00\x01|$)", stream, re.S)
  rbsp = nal.group(1)[2:].replace(b"\x00\x00\x03", b"\x00\x00")
  bits = "".join(f"{b:08b}" for b in rbsp)
  def ue(pos: int) -> int:   # the position after the Exp-Golomb code at pos
    return pos + 2 * (bits.index("1", pos) - pos) + 1
  size_at = ue(ue(4 + 3 + 1 + 96))   # VPS id, sub-layers, nesting flag, profile_tier_level; then the SPS id, chroma_format_idc
  code = lambda v: f"{v + 1:b}".rjust(2 * len(f"{v + 1:b}") - 1, "0")
  new = bits[:size_at] + code(width) + code(height) + bits[ue(ue(size_at)):bits.rindex("1") + 1]
  new += "0" * (-len(new) % 8)
  rbsp = re.sub(rb"\x00\x00(?=[\x00-\x03])", b"\x00\x00\x03", bytes(int(new[i:i + 8], 2) for i in range(0, len(new), 8)))
  return stream[:nal.start(1)] + nal.group(1)[:2] + rbsp + stream[nal.end(1):]

AUD = b"\x00\x00\x01\x46\x01\x50"   # an HEVC access unit delimiter: a NAL unit of no picture
VIDEOS = {   # name -> (its bytes, or a size of sparse zeros; what the refusal says)
  "8192x8192 declared": (lambda: declaring(hevc(64, 64, 3), 8192, 8192), "video is 8192x8192, over the 9437184 pixels"),
  "NAL units without a picture": (lambda: hevc(64, 64, 1) + AUD * 200_000, f"{MAX_NALS + 1} NAL units in a row up to byte "),
  "256 MiB of zeros": (lambda: 256 << 20, "cannot open as video"),
}

@pytest.mark.parametrize("video", VIDEOS)
def test_hostile_video_file_is_refused(video, tmp_path):
  """camerad --source road=FILE on a stream declaring 8192x8192 pictures, on 200,000 access unit delimiters (FFmpeg
  kept a few KiB per NAL unit of the packet they make: 0.9 GB) and on zeros named .hevc (FFmpeg's raw demuxer read
  them all): exit 1 naming the file, in bounded memory."""
  make, why = VIDEOS[video]
  write_bomb(path := tmp_path / "road.hevc", make())
  rc, out, rss = run_reader("-m", "camerad", "--source", f"road={path}")
  assert rss < MAX_RSS_MB, f"{video}: peak RSS {rss} MB"
  assert rc == 1 and f"{path}: " in out and why in out, out[-3000:]

def test_route_with_hostile_video_is_refused(scene, tmp_path):
  """A route whose logs are sound and whose road video is zeros (read as the raw HEVC a route holds: FFmpeg's demuxer
  looks for a start code through all of it) or a flood of NAL units: camerad serves no frame of it, says why naming
  the file, and exits 1 in bounded memory."""
  write_route(route := tmp_path / "r", scene, cameras=("road",), segments=1, frames=3)
  video = route / "r--0" / "fcamera.hevc"
  for content, why in ((256 << 20, "no video packet in the "), (video.read_bytes() + AUD * 200_000, " NAL units in a row up to byte ")):
    video.unlink()
    write_bomb(video, content)
    rc, out, rss = run_reader("-m", "camerad", "--source", route)
    assert rss < MAX_RSS_MB, f"peak RSS {rss} MB"
    assert rc == 1 and f"{video}: " in out and why in out, out[-3000:]

# ---- recordings

def modes(root: Path) -> dict[str, str]:
  """{path under root: its permission bits} of root and everything in it."""
  return {str(p.relative_to(root.parent)): oct(stat.S_IMODE(p.lstat().st_mode)) for p in [root, *sorted(root.rglob("*"))]}

def record_segment(route: Path) -> None:
  """A route of one segment as modeld-record writes one: logs and a camera's video."""
  w = RouteWriter(route)
  seg = w.open_segment(0)
  w.write(0, "carState", event("carState", 1))
  v = HevcWriter(seg / "fcamera.hevc", 64, 64)
  v.write(av.VideoFrame(64, 64, "yuv420p"), 1, 1, 2)
  v.close()
  w.close()

@pytest.mark.parametrize("umask", [0o000, 0o022])
def test_recordings_are_private_whatever_the_umask(umask, tmp_path, monkeypatch):
  """A route (the folders made for it, its segments, rlog, qlog and video) is 0700/0600 under any umask, and 0770/0660
  of MSGQ_GROUP's group with it set; modeld-record as a process writes the same."""
  old = os.umask(umask)
  try:
    record_segment(tmp_path / "new" / "routes" / "r")
    monkeypatch.setenv("MSGQ_GROUP", str(gid := os.getgid()))
    record_segment(tmp_path / "group" / "r")
  finally: os.umask(old)
  folder, file = "0o700", "0o600"
  assert modes(tmp_path / "new") == {"new": folder, "new/routes": folder, "new/routes/r": folder, "new/routes/r/r--0": folder,
                                     "new/routes/r/r--0/fcamera.hevc": file, "new/routes/r/r--0/qlog.zst": file, "new/routes/r/r--0/rlog.zst": file}
  assert set(modes(tmp_path / "group" / "r").values()) == {"0o770", "0o660"} and \
    {p.stat().st_gid for p in (tmp_path / "group" / "r").rglob("*")} == {gid}
  monkeypatch.delenv("MSGQ_GROUP")
  r = subprocess.run([sys.executable, "-m", "modeld_tools.record", "--route", tmp_path / "rec" / "r", "--seconds", "0.3", "carState"],
                     cwd=ROOT, capture_output=True, text=True, timeout=60, preexec_fn=lambda: os.umask(umask))
  assert r.returncode == 0, r.stderr
  assert modes(tmp_path / "rec") == {"rec": folder, "rec/r": folder, "rec/r/r--0": folder, "rec/r/r--0/qlog.zst": file, "rec/r/r--0/rlog.zst": file}

def test_a_symlink_in_the_way_of_a_recording_is_refused(tmp_path):
  """A route folder, a segment folder, a log, a video or a finalize's temporary file that is a symlink (to a file or
  folder elsewhere) is refused by name, and what it points to is left as it was; modeld-record exits 1 saying so."""
  elsewhere = tmp_path / "elsewhere"
  elsewhere.mkdir()
  (target := elsewhere / "file").write_bytes(b"theirs")
  (tmp_path / "route").symlink_to(elsewhere)
  with pytest.raises(NotOwnedError, match=f"route folder {tmp_path / 'route'} is a symlink: refused"): RouteWriter(tmp_path / "route")
  w = RouteWriter(route := tmp_path / "r")
  (route / "r--0").symlink_to(elsewhere)
  with pytest.raises(NotOwnedError, match="segment folder .*r--0 is a symlink: refused"): w.open_segment(0)
  (route / "r--0").unlink()
  (route / "r--0").mkdir()
  for name in ("rlog.zst", "fcamera.hevc"): (route / "r--0" / name).symlink_to(target)
  with pytest.raises(NotOwnedError, match="rlog.zst is a symlink: refused"): LogFile(route / "r--0" / "rlog.zst")
  with pytest.raises(NotOwnedError, match="fcamera.hevc is a symlink: refused"): HevcWriter(route / "r--0" / "fcamera.hevc", 64, 64)
  log = tmp_path / "log" / "rlog.zst"
  log.parent.mkdir()
  log.write_bytes(zstd.compress(event("carState", 1)))
  (log.parent / "rlog.zst.tmp").symlink_to(target)
  with pytest.raises(NotOwnedError, match="rlog.zst.tmp is a symlink: refused"): finalize(log)
  assert target.read_bytes() == b"theirs" and sorted(p.name for p in elsewhere.iterdir()) == ["file"]
  r = subprocess.run([sys.executable, "-m", "modeld_tools.record", "--route", tmp_path / "route", "--seconds", "0.3", "carState"],
                     cwd=ROOT, capture_output=True, text=True, timeout=60)
  assert r.returncode == 1 and f"route folder {tmp_path / 'route'} is a symlink: refused" in r.stderr, r.stderr

def test_another_accounts_folder_is_not_recorded_into(tmp_path):
  """A route folder (or a folder made for a segment) of another account is refused by name, and nothing is written
  into it."""
  uid = nobody_uid()
  (theirs := tmp_path / "theirs").mkdir()
  os.chown(theirs, uid, -1)
  with pytest.raises(NotOwnedError, match=f"route folder {theirs} belongs to uid {uid}"): RouteWriter(theirs)
  w = RouteWriter(route := tmp_path / "r")
  (route / "r--0").mkdir()
  os.chown(route / "r--0", uid, -1)
  with pytest.raises(NotOwnedError, match=f"segment folder {route / 'r--0'} belongs to uid {uid}"): w.open_segment(0)
  assert list(theirs.iterdir()) == [] and list((route / "r--0").iterdir()) == []

def test_sort_by_time_holds_a_window_not_the_file(tmp_path, monkeypatch):
  """sort_by_time holds a window of events (here 8: SORT_EVENTS 4), not the file: the order of a sort of the whole
  file where no event is further out of order, and an event that is comes out late, counted in a warning (a whole
  file held for its sort is memory the file's size sets)."""
  from oproute import logreader
  monkeypatch.setattr(logreader, "SORT_EVENTS", 4)
  def times(ts: list[int]) -> tuple[list[int], list[str]]:
    (path := tmp_path / "rlog").write_bytes(b"".join(event("carState", t) for t in ts))
    lr = logreader.LogReader(path, sort_by_time=True, log_warnings=False)
    return [ev.logMonoTime for ev in lr], lr.warnings
  near = [2, 1, 4, 3, 6, 5, 9, 7, 8, 10, 12, 11]
  assert times(near) == (sorted(near), [])
  got, warnings = times([*range(2, 13), 1, 13])
  assert got == [2, 3, 4, 5, 1, *range(6, 14)] and warnings == [f"{tmp_path / 'rlog'}: 1 events further out of time order than 4 "
                                                                "events or 32 MiB: read after later ones"], (got, warnings)
