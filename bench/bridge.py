#!/usr/bin/env python3
"""Live from a (fake) comma device: modeld-fakedevice's HEVC cameras through camerad --source bridge to modeld and
dmonitoringd, on loopback, with one camera, with three, and with three through a 2 s network stall; prints each
camera's frame age when served and the outputs' (HELP). docs/CAMERAD.md has the figures.

usage: bench/bridge.py [--seconds 20]"""
import argparse, os, pathlib, re, signal, subprocess, sys, tempfile, time, uuid
REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO)]
os.environ.setdefault("DEV", "CPU")
import numpy as np

HELP = """Live from a (fake) comma device: modeld-fakedevice sends the demo scene's cameras, 1928x1208 HEVC at 20 Hz, on the
bridge's ports of loopback; camerad --source bridge decodes and serves them; modeld and dmonitoringd answer. Three runs:
the road camera alone (a device that bridges only it), all three, and all three with the device stopped for 2 s
mid-run (SIGSTOP: it then sends the frames it owes at once, as after a network stall). Each camera's frame age is
measured at its camera-state message (the device's EOF to the buffer published, plus a loopback hop), the outputs' at
their arrival (the fake device's clock is this machine's; camerad corrects a real device's from the fastest frame to
arrive); the ratio is frame age p50 to the frame period (50 ms). Then camerad's skip counts."""
STATES = {"road": "roadCameraState", "wide": "wideRoadCameraState", "driver": "driverCameraState"}

def spawn(*argv: str) -> tuple[subprocess.Popen, object]:
  log = tempfile.TemporaryFile("w+")   # a file, not a pipe: nothing blocks on it
  return subprocess.Popen([sys.executable, "-m", *argv], cwd=REPO, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PARALLEL": "0"}), log

def text(log) -> str:
  log.seek(0)
  return log.read()

def run(art, cameras: str, seconds: float, stall: bool) -> None:
  from cereal import messaging
  from msgq import remove_stack
  os.environ["OPENPILOT_PREFIX"] = f"bench{uuid.uuid4().hex[:8]}"
  procs = []
  try:
    procs.append(dev := spawn("modeld_tools.fakedevice", "--source", "synthetic:straight", "--cameras", cameras, "--bind", "127.0.0.1", "--clip", "40"))
    while "serving" not in text(dev[1]):
      if dev[0].poll() is not None: raise SystemExit(f"modeld-fakedevice exited:\n{text(dev[1])}")
      time.sleep(0.2)
    procs.append(spawn("camerad", "--source", "bridge:127.0.0.1", "--artifacts", str(art)))
    procs += [spawn(d, "--artifacts", str(art)) for d in ("modeld", "dmonitoringd")]
    services = [STATES[c] for c in cameras.split(",")] + ["modelV2", "driverStateV2"]
    socks = {s: messaging.sub_sock(s, timeout=100) for s in services}
    ages, eof = {s: [] for s in services}, {}   # eof: the driver frames' timestampEof by frame id
    settle = time.monotonic() + 10   # the daemons' start-up left out
    deadline, stall_at = settle + seconds, settle + seconds / 2
    while time.monotonic() < deadline:
      if stall and time.monotonic() > stall_at:
        dev[0].send_signal(signal.SIGSTOP)
        time.sleep(2)
        dev[0].send_signal(signal.SIGCONT)
        stall = False
      for s, sock in socks.items():
        while (dat := sock.receive(non_blocking=True)) is not None:
          now, m = time.monotonic_ns(), getattr(messaging.log_from_bytes(dat), s)
          if s == "driverCameraState": eof[m.frameId] = m.timestampEof
          t = eof.get(m.frameId) if s == "driverStateV2" else m.timestampEof
          if now > settle * 1e9 and t: ages[s].append((now - t) / 1e6)
      time.sleep(0.001)
    for s, a in ages.items():
      print(f"  {s:20s} {len(a):4d} in {seconds:g} s; frame age p50 {np.percentile(a, 50):6.1f} ms, p99 {np.percentile(a, 99):6.1f} ms, "
            f"max {max(a):6.1f} ms, ratio p50 / frame period {np.percentile(a, 50) / 50:.3f}" if a else f"  {s}: none")
  finally:
    for p, log in reversed(procs):
      if p.poll() is None: p.send_signal(signal.SIGCONT); p.terminate()
      p.wait(20)
      if p is procs[1][0]:
        skips = re.findall(r"skipped (\d+): (.*)", text(log))
        print("  camerad skipped: " + ("; ".join(f"{n} {why}" for n, why in skips) if skips else "nothing"))
      log.close()
    remove_stack()

def main() -> int:
  ap = argparse.ArgumentParser(description=HELP)
  ap.add_argument("--seconds", type=float, default=20., help="measured seconds per run (default 20)")
  args = ap.parse_args()
  from msgq.visionipc import NV12Layout
  from tests.artifacts import CACHE, build
  art = build(CACHE.parent / "bench-reference", (NV12Layout.packed(1928, 1208),), models="reference")
  for cameras, stall, what in (("road", False, "the road camera alone"), ("road,wide,driver", False, "three cameras"),
                               ("road,wide,driver", True, "three cameras, the device stopped for 2 s mid-run")):
    print(f"{what}:", flush=True)
    run(art, cameras, args.seconds, stall)
  return 0

if __name__ == "__main__": sys.exit(main())
