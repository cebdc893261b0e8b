#!/usr/bin/env python3
"""msgq on its two transports (shm, zmq), publisher and subscriber in separate processes: latency of paced sends and
what a burst delivers, in rounds that take turns between the transports. Prints every figure, then the ratio the target
is about; docs/PERFORMANCE.md says how each is measured."""
import json, os, queue, subprocess, sys, threading, time
import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KiB = 1024
CASES = [("1 KiB", KiB, 20000), ("300 KiB", 300 * KiB, 400)]   # name, message size, burst length
ROUNDS, PER_ROUND, GAP_S = 8, 100, 0.002                      # latency: rounds x messages per implementation, pause between
END = b"\xff" * 8

def child(role: str, kind: str, size: int) -> None:
  """A publisher or subscriber of endpoint "bench_<kind>", driven by JSON lines on stdin, answering on stdout."""
  import msgq
  say = lambda obj: (sys.stdout.write(json.dumps(obj) + "\n"), sys.stdout.flush())
  if role == "sub":
    sub, poller = msgq.SubSocket(), msgq.Poller()
    sub.connect(msgq.Context(), f"bench_{kind}")
    poller.registerSocket(sub)
    say("up")
    lat, n, last, phase = [], 0, 0, None
    while True:
      for s in poller.poll(1000):
        while (m := s.receive(non_blocking=True)) is not None:
          now = time.monotonic_ns()
          if m[:8] == END:   # the end of a phase, sent until we answer: once per phase
            if m[8:12] != phase: say({"phase": int.from_bytes(m[8:12], "little"), "lat": lat, "n": n, "last": last})
            lat, n, phase = [], 0, m[8:12]
            continue
          t = int.from_bytes(m[:8], "little")
          if m[8:9] == b"L": lat.append((now - t) / 1e3)
          else: n, last = n + 1, now
  pub = msgq.PubSocket()
  pub.connect(msgq.Context(), f"bench_{kind}")
  body = os.urandom(size - 9)
  say("up")
  for line in sys.stdin:
    cmd = json.loads(line)
    if cmd == "readers":
      while not pub.all_readers_updated(): time.sleep(0.001)
    elif cmd == "latency":
      for _ in range(PER_ROUND):
        time.sleep(GAP_S)
        pub.send(time.monotonic_ns().to_bytes(8, "little") + b"L" + body)
    elif cmd == "burst":
      msgs = [i.to_bytes(8, "little") + b"B" + body for i in range(8)]   # made beforehand: only sending is timed
      t0 = time.monotonic_ns()
      for i in range(n_burst := next(b for _, s, b in CASES if s == size)): pub.send(msgs[i & 7])
      say({"t0": t0, "send_s": (time.monotonic_ns() - t0) / 1e9, "sent": n_burst})
      continue
    elif isinstance(cmd, list): pub.send(END + cmd[1].to_bytes(4, "little"))   # ["end", phase]
    say("done")

class Side:
  """One child of one implementation; what it says is read by a thread into a queue."""
  def __init__(self, role: str, kind: str, size: int, env: dict):
    # -P: this script (bench/msgq.py) must not be `import msgq`
    self.p = subprocess.Popen([sys.executable, "-B", "-P", __file__, "--child", role, kind, str(size)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, env=env)
    self.said, self.name = queue.Queue(), f"{kind} {role}"
    threading.Thread(target=self._read, daemon=True).start()
    assert self.hear() == "up", f"{self.name} did not start"
  def _read(self) -> None:
    for line in self.p.stdout:
      self.said.put(json.loads(line))
    self.said.put(None)
  def hear(self, timeout: float = 60):
    if (obj := self.said.get(timeout=timeout)) is None: raise RuntimeError(f"{self.name} exited ({self.p.wait()})")
    return obj
  def ask(self, cmd):
    self.p.stdin.write(json.dumps(cmd) + "\n"); self.p.stdin.flush()
    return self.hear()
  def close(self) -> None: self.p.kill(); self.p.wait()

def end(sub: Side, pub: Side, phase: int) -> dict:
  """The subscriber's figures of a phase: its end marker is sent until it answers (a lapped reader loses a marker)."""
  while True:
    pub.ask(["end", phase])
    try:
      while (got := sub.hear(0.3))["phase"] != phase: pass
      return got
    except queue.Empty: pass

def environments() -> dict[str, dict]:
  prefix = f"bench-msgq-{os.getpid()}"
  base = {**os.environ, "OPENPILOT_PREFIX": prefix, "PYTHONPATH": REPO}
  return {"shm": {**base, "MSGQ_TRANSPORT": "shm"}, "zmq": {**base, "MSGQ_TRANSPORT": "zmq"}}

def run(size: int, envs: dict) -> dict:
  sides = {k: (Side("sub", k, size, env), Side("pub", k, size, env)) for k, env in envs.items()}
  try:
    for _, pub in sides.values(): pub.ask("readers")
    lat = {k: [] for k in sides}
    phase = 0
    for _ in range(ROUNDS):   # taking turns
      for k, (sub, pub) in sides.items():
        pub.ask("latency")
        lat[k] += end(sub, pub, phase := phase + 1)["lat"]
    out = {}
    for k, (sub, pub) in sides.items():
      b = pub.ask("burst")
      got = end(sub, pub, phase := phase + 1)
      out[k] = {"p50": np.percentile(lat[k], 50), "p99": np.percentile(lat[k], 99), "n": len(lat[k]), "send_rate": b["sent"] / b["send_s"],
                "recv_rate": got["n"] / max((got["last"] - b["t0"]) / 1e9, 1e-9), "got": got["n"], "sent": b["sent"]}
    return out
  finally:
    for sub, pub in sides.values(): sub.close(); pub.close()

def main() -> None:
  envs = environments()
  ratios = []
  for name, size, _ in CASES:
    res = run(size, envs)
    for k, r in res.items():
      print(f"{name:7s} {k:8s}: latency p50 {r['p50']:7.1f} us  p99 {r['p99']:7.1f} us  ({r['n']} messages)   burst: sent "
            f"{r['send_rate']:8.0f} msg/s, delivered {r['recv_rate']:8.0f} msg/s ({r['got']}/{r['sent']})")
    ratios.append(f"{name}: shm/zmq latency p50 {res['shm']['p50'] / res['zmq']['p50']:.2f} (target <= 1)")
  import shutil
  shutil.rmtree(f"/dev/shm/msgq_{envs['shm']['OPENPILOT_PREFIX']}", ignore_errors=True)
  for r in ratios: print("ratio", r)

if __name__ == "__main__":
  if sys.argv[1:2] == ["--child"]: child(sys.argv[2], sys.argv[3], int(sys.argv[4]))
  else: main()
