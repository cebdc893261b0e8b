#!/usr/bin/env python3
"""Live from a (fake) comma device: modeld-fakedevice's HEVC cameras through camerad --source bridge to modeld and
dmonitoringd, on loopback; prints decode time and frame ages (HELP). docs/CAMERAD.md has the figures.

usage: bench/bridge.py [--seconds 30]
"""
import argparse, os, pathlib, re, subprocess, sys, tempfile, time, uuid
REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO)]
os.environ.setdefault("DEV", "CPU")
os.environ["OPENPILOT_PREFIX"] = f"bench{uuid.uuid4().hex[:8]}"
import numpy as np

HELP = """Live from a (fake) comma device: modeld-fakedevice sends the demo scene's three cameras, 1928x1208 HEVC at 20 Hz, on
the bridge's ports of loopback; camerad --source bridge decodes and serves them; modeld and dmonitoringd answer. Prints
camerad's decode time per frame and frame age when served (the device's EOF to the buffer published), and the frame
age at modelV2's and driverStateV2's arrival here, from the frame's timestampEof (the fake device's clock is this
machine's: a real device's differs, and camerad corrects for it from the fastest frame to arrive)."""

def spawn(*argv: str) -> tuple[subprocess.Popen, object]:
  log = tempfile.TemporaryFile("w+")   # a file, not a pipe: nothing blocks on it
  return subprocess.Popen([sys.executable, "-m", *argv], cwd=REPO, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PARALLEL": "0"}), log

def text(log) -> str:
  log.seek(0)
  return log.read()

def main() -> int:
  ap = argparse.ArgumentParser(description=HELP)
  ap.add_argument("--seconds", type=float, default=30., help="measured seconds (default 30; camerad prints its stats every 10)")
  args = ap.parse_args()
  from cereal import messaging
  from msgq import remove_stack
  from msgq.visionipc import NV12Layout
  from tests.artifacts import CACHE, build
  layout = NV12Layout.packed(1928, 1208)
  art = build(CACHE.parent / "bench-reference", (layout,), models="reference")
  procs = []
  try:
    t = time.perf_counter()
    procs.append(dev := spawn("modeld_tools.fakedevice", "--source", "synthetic:straight", "--bind", "127.0.0.1", "--clip", "40"))
    while "serving" not in text(dev[1]):
      if dev[0].poll() is not None: raise SystemExit(f"modeld-fakedevice exited:\n{text(dev[1])}")
      time.sleep(0.2)
    print(f"fake device: 3 cameras of {layout.width}x{layout.height} encoded in {time.perf_counter() - t:.1f} s: {text(dev[1]).strip()}")
    procs.append(cam := spawn("camerad", "--source", "bridge:127.0.0.1", "--artifacts", str(art)))
    procs += [spawn(d, "--artifacts", str(art)) for d in ("modeld", "dmonitoringd")]
    socks = {s: messaging.sub_sock(s, timeout=100) for s in ("modelV2", "driverStateV2", "driverCameraState")}
    ages, eof = {"modelV2": [], "driverStateV2": []}, {}   # eof: the driver frames' timestampEof by frame id
    deadline, settle = time.monotonic() + args.seconds + 10, time.monotonic() + 10   # the daemons' start-up left out
    while time.monotonic() < deadline:
      for s, sock in socks.items():
        if (dat := sock.receive(non_blocking=True)) is None: continue
        now, m = time.monotonic_ns(), getattr(messaging.log_from_bytes(dat), s)
        if s == "driverCameraState": eof[m.frameId] = m.timestampEof
        elif time.monotonic() > settle and (t := m.timestampEof if s == "modelV2" else eof.get(m.frameId)): ages[s].append((now - t) / 1e6)
      time.sleep(0.001)
    stats = [l for l in text(cam[1]).splitlines() if "camerad: stats" in l]
    print(f"camerad, its last stats line: {stats[-1] if stats else 'none: ' + text(cam[1])[-2000:]}")
    for s, a in ages.items():
      print(f"{s}: {len(a)} in {args.seconds:g} s; frame age at its arrival (from the frame's timestampEof): p50 {np.percentile(a, 50):.1f} ms, "
            f"p99 {np.percentile(a, 99):.1f} ms" if a else f"{s}: none")
    if stats and (m := re.search(r"decode_ms_p50=([\d.]+).*frame_age_ms_p50=([\d.]+)", stats[-1])):
      print(f"ratio decode p50 / frame period (50 ms): {float(m.group(1)) / 50:.3f}; camerad frame age p50 {m.group(2)} ms")
  finally:
    for p, log in procs:
      p.terminate()
      p.wait(20)
      log.close()
    remove_stack()
  return 0

if __name__ == "__main__": sys.exit(main())
