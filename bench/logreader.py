#!/usr/bin/env python3
"""LogReader benchmark: iterating a log of many small events, against the bare parse openpilot's LogReader does.

Both sides read one rlog.zst of EVENTS events and touch every event; CPU time of this process, best of --repeat.
The last lines are ours/baseline, in file order and with sort_by_time; docs/PERFORMANCE.md says what each side does.
usage: bench/logreader.py [--events 50000] [--repeat 5]"""
import argparse, pathlib, sys, tempfile, time
REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

def write_log(path: pathlib.Path, n: int) -> None:
  from cereal import messaging
  from oproute.writer import LogFile
  f = LogFile(path)
  for i in range(n):
    m = messaging.new_message(("carState", "roadCameraState", "liveCalibration", "modelV2")[i % 4])
    if i % 4 == 0: m.carState.vEgo = i
    elif i % 4 == 1: m.roadCameraState.frameId = i
    elif i % 4 == 2: m.liveCalibration.rpyCalib = [0.0, 0.01, 0.02]
    else:
      m.modelV2.frameId, m.modelV2.laneLineProbs = i, [0.5] * 4
      m.modelV2.position.x = [float(j) for j in range(33)]
    f.write(m.to_bytes())
    if i % 1000 == 999: f.flush()
  f.close()

def best_cpu(fn, repeat: int) -> float:
  best = float("inf")
  for _ in range(repeat):
    t = time.process_time()
    fn()
    best = min(best, time.process_time() - t)
  return best

def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--events", type=int, default=50_000)
  ap.add_argument("--repeat", type=int, default=5)
  args = ap.parse_args()
  import zstandard as zstd
  from cereal import log
  from oproute import LogReader
  with tempfile.TemporaryDirectory() as d:
    path = pathlib.Path(d) / "rlog.zst"
    write_log(path, args.events)
    print(f"{args.events} events, {path.stat().st_size / 1e6:.2f} MB compressed")
    def ours() -> None:
      lr = LogReader(path)
      assert sum(1 for ev in lr if ev.which()) == args.events and not lr.warnings, lr.warnings
    def ours_sorted() -> None:
      assert sum(1 for ev in LogReader(path, sort_by_time=True) if ev.which()) == args.events
    def baseline() -> None:
      assert sum(1 for ev in log.Event.read_multiple_bytes(zstd.decompress(path.read_bytes())) if ev.which()) == args.events
    t_ours, t_sorted, t_base = best_cpu(ours, args.repeat), best_cpu(ours_sorted, args.repeat), best_cpu(baseline, args.repeat)
  print(f"ours: LogReader {t_ours:.3f} s CPU ({t_ours / args.events * 1e6:.2f} us/event), sort_by_time {t_sorted:.3f} s")
  print(f"baseline: zstd + read_multiple_bytes, unchecked {t_base:.3f} s CPU ({t_base / args.events * 1e6:.2f} us/event)")
  print(f"ratio ours/baseline: {t_ours / t_base:.2f}, sort_by_time {t_sorted / t_base:.2f}")

if __name__ == "__main__":
  main()
