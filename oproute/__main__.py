"""python -m oproute: a route's events per service and time span, and --finalize for the logs a crash left."""
from __future__ import annotations
import argparse, sys, time
from pathlib import Path
from oproute.logreader import MODES, ZSTD_MAGIC, CompressedDataError, LogReader, decompressed, segment_number
from oproute.writer import finalize, unfinished

QUIET_S = 5.   # a log written to more recently may still be recorded (the recorder flushes every 0.5 s by default)

def _cut_short(path: Path) -> bool:
  """A zstd log that ends inside a frame or is damaged, whatever its header says (a one-frame log copied in part)."""
  with open(path, "rb") as f:
    if f.read(4) != ZSTD_MAGIC: return False
    f.seek(0)
    try:
      for _ in decompressed(f): pass
    except CompressedDataError: return True
  return False

def _finalize(logs: list[Path]) -> None:
  """Each unfinished or cut-short zstd log of these logs' segments (rlog and qlog) rewritten as one frame of what reads;
  one still being written to is left alone: rewriting it under a running recorder would lose what it writes next."""
  for log in logs:
    for f in [log] if segment_number(log.parent) < 0 else [log.parent / "rlog.zst", log.parent / "qlog.zst"]:
      if not f.is_file() or not (unfinished(f) or _cut_short(f)): continue
      if (age := time.time() - f.stat().st_mtime) < QUIET_S:
        print(f"left {f} alone: written to {age:.1f} s ago (still being recorded?)")
        continue
      problem = finalize(f, repair=True)
      print(f"finalized {f}" + (f" ({problem})" if problem else ""))

def main(argv: list[str] | None = None) -> int:
  ap = argparse.ArgumentParser(prog="python -m oproute", description="Summarise a route, segment or log file: events per service and time span.")
  ap.add_argument("path", nargs="+", help="log file (rlog/qlog, .zst/.bz2/plain), segment folder, route folder or route name "
                  "(a route may end in a segment range and a mode, as openpilot's: ROUTE/2:4/q, ROUTE--2:4)")
  ap.add_argument("--mode", choices=MODES, default="a", help="r: rlogs, q: qlogs, a (or i): rlog where there is one (default)")
  ap.add_argument("--finalize", action="store_true", help="first rewrite each log a crash left unfinished (zstd frames "
                  "without their size) or a copy cut short, which one-shot readers such as openpilot's LogReader refuse, "
                  "as one frame of what reads")
  args = ap.parse_args(argv)
  try:
    lr = LogReader(args.path, args.mode)
    if args.finalize: _finalize(lr.files)
    counts: dict[str, int] = {}
    t0 = t1 = None
    for ev in lr:
      counts[ev.which()] = counts.get(ev.which(), 0) + 1
      t0, t1 = min(t0 or ev.logMonoTime, ev.logMonoTime), max(t1 or 0, ev.logMonoTime)
  except (OSError, ValueError) as e:
    print(f"python -m oproute: {e}", file=sys.stderr)
    return 1
  for s, n in sorted(counts.items()): print(f"{s:24s} {n}")
  if t0 is not None: print(f"{sum(counts.values())} events over {(t1 - t0) / 1e9:.2f} s in {len(lr.files)} file(s)")
  return 1 if lr.warnings else 0

if __name__ == "__main__":
  sys.exit(main())
