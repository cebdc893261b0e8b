"""modeld-record as a real process over real pub/sub, and LogReader on what it wrote (and on damaged files)."""
import os, signal, socket, subprocess, sys, time
from pathlib import Path
import pytest
import zstandard as zstd
from cereal import messaging
from tools.logreader import LOG_NAME, LogReader, log_files, read_log_file, segment_dirs, split_messages
from tools.record import LogWriter

ROOT = Path(__file__).resolve().parents[1]

def start_recorder(tmp_path: Path, *args: str) -> subprocess.Popen:
  """modeld-record with NOTIFY_SOCKET set; returns once it reported READY=1 (it has subscribed by then)."""
  ready = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
  ready.bind(str(tmp_path / "notify"))
  ready.settimeout(20)
  p = subprocess.Popen([sys.executable, "-m", "tools.record", *map(str, args)], cwd=ROOT, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True, env={**os.environ, "NOTIFY_SOCKET": str(tmp_path / "notify")})
  try:
    while b"READY=1" not in ready.recv(4096): pass
  except TimeoutError:
    p.kill()
    pytest.fail(f"modeld-record did not get ready: {p.communicate()[1]}")
  finally:
    ready.close()
  return p

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
  p = start_recorder(tmp_path, "carState", "liveCalibration", "--route", route, "--segment-seconds", "0.3", "--flush-seconds", "0.1")
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
    time.sleep(0.5)   # > the flush interval: all of this is on disk now
    flushed = {s: len(v) for s, v in sent.items()}
    for i in range(150, 400):
      send(i)
      if i == 300: p.send_signal(signal.SIGKILL)
    p.wait(10)
  finally:
    if p.poll() is None: p.kill()
    pm.close()
  segs = segment_dirs(route)
  assert len(segs) >= 3, f"expected several 0.3 s segments, got {[s.name for s in segs]}"
  for seg in segs[:-1]:
    lr = LogReader(seg)
    list(lr)
    assert lr.warnings == [], f"closed segment {seg.name}: {lr.warnings}"
  got = by_service(LogReader(route).raw())
  for s, msgs in sent.items():
    assert got[s] == msgs[:len(got[s])], f"{s}: what reads back is not what was sent"
    assert len(got[s]) >= flushed[s], f"{s}: {len(got[s])} read back, {flushed[s]} were flushed before the kill"

def test_sigterm_closes_and_skips_malformed(tmp_path):
  """A clean stop closes the segment; a message that is not a whole Event of its service is not recorded (it would
  break the file's framing); events come back in time order across services."""
  route = tmp_path / "route"
  pm = messaging.PubMaster(["carState", "liveCalibration"])
  p = start_recorder(tmp_path, "carState", "liveCalibration", "--route", route)
  try:
    good = []
    for i in range(20):
      good.append(car(i) if i % 2 else calib(i))
      pm.send("carState" if i % 2 else "liveCalibration", good[-1])
      if i == 5: pm.send("carState", b"\x00\x00\x00\x00\xff\xff\x00\x00garbage")   # segment table claims more than it has
      if i == 7: pm.send("carState", calib(7))   # a whole Event, of the wrong service
      time.sleep(0.01)
    time.sleep(0.3)
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=10)
    assert p.returncode == 0, err
  finally:
    if p.poll() is None: p.kill()
    pm.close()
  assert "carState: 2 malformed messages not recorded" in err
  lr = LogReader(route)
  events = list(lr.raw())
  assert [d for d, _ in events] == good and lr.warnings == []
  times = [ev.logMonoTime for _, ev in events]
  assert times == sorted(times)

def write_log(path: Path, msgs: list[bytes], flush_every: int = 7) -> None:
  w = LogWriter(path)
  for i, m in enumerate(msgs):
    w.write(m)
    if i % flush_every == flush_every - 1: w.flush()
  w.close()

def test_truncated_tail_reads_up_to_last_whole_message(tmp_path):
  msgs = [car(i) for i in range(40)]
  path = tmp_path / LOG_NAME
  write_log(path, msgs)
  assert [d for d, _ in LogReader(path).raw()] == msgs
  # content cut in the middle of message 25 (as a crash mid-write leaves it), compressed as a valid zstd stream
  content = read_log_file(path)
  assert content == b"".join(msgs)
  cut = sum(map(len, msgs[:25])) + len(msgs[25]) // 2
  path.write_bytes(zstd.ZstdCompressor().compress(content[:cut]))
  lr = LogReader(path)
  assert [d for d, _ in lr.raw()] == msgs[:25]
  assert len(lr.warnings) == 1 and "not a whole message" in lr.warnings[0]
  # the compressed file itself cut anywhere: a prefix of the messages, no exception
  write_log(path, msgs)
  data = path.read_bytes()
  for n in (len(data) - 1, len(data) - 5, len(data) * 2 // 3, len(data) // 3, 10, 0):
    path.write_bytes(data[:n])
    got = [d for d, _ in LogReader(path).raw()]
    assert got == msgs[:len(got)], n

def test_split_messages_framing():
  msgs = [car(1), calib(2), car(3)]
  blob = b"".join(msgs)
  assert split_messages(blob) == (msgs, 0)
  assert split_messages(blob[:-3]) == (msgs[:2], len(msgs[2]) - 3)
  assert split_messages(b"\xff\xff\xff\xff" + blob) == ([], len(blob) + 4)   # implausible segment count: no message

def test_logreader_paths(tmp_path):
  route = tmp_path / "r"
  for n, msgs in enumerate([[car(1), car(2)], [car(3)], [car(4), car(5)]]):
    (route / f"r--{n}").mkdir(parents=True)
    write_log(route / f"r--{n}" / LOG_NAME, msgs)
  (route / "r--10").mkdir()   # a segment folder without a log (e.g. only video) is not a segment
  assert [d.name for d in segment_dirs(route)] == ["r--0", "r--1", "r--2"]
  assert [ev.carState.vEgo for ev in LogReader(route)] == [1, 2, 3, 4, 5]
  assert [ev.carState.vEgo for ev in LogReader(route / "r--2")] == [4, 5]
  assert [ev.carState.vEgo for ev in LogReader(route / "r--1" / LOG_NAME)] == [3]
  plain = tmp_path / "rlog"
  plain.write_bytes(car(7) + car(8))
  assert [ev.carState.vEgo for ev in LogReader(plain)] == [7, 8]
  with pytest.raises(FileNotFoundError, match="no such log, segment or route"): log_files(tmp_path / "nope")
  (tmp_path / "empty").mkdir()
  with pytest.raises(FileNotFoundError, match="expected a route folder"): LogReader(tmp_path / "empty")

def test_record_cli_errors(tmp_path):
  def run(*args):
    return subprocess.run([sys.executable, "-m", "tools.record", *map(str, args)], cwd=ROOT, capture_output=True, text=True, timeout=30)
  r = run("notAService")
  assert r.returncode == 2 and "unknown services ['notAService']" in r.stderr
  r = run("--video", "rear")
  assert r.returncode == 2 and "--video" in r.stderr
  (tmp_path / "r" / "r--0").mkdir(parents=True)
  r = run("--route", tmp_path / "r", "--seconds", "0.1")
  assert r.returncode == 1 and "already has segments" in r.stderr
  r = run("--help")
  assert r.returncode == 0 and "--segment-seconds" in r.stdout and "--flush-seconds" in r.stdout
