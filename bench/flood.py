#!/usr/bin/env python3
"""A subscription flood over TCP (MSGQ_TCP=1) on both transports: a modeld-like publisher (fixed GIL-holding work,
then a 50 KB send, as fast as it can) and a TCP peer in another process subscribing to --topics distinct 64-byte
topics within --flood-s s, at the lowest CPU priority. The publisher's RSS, rate and CPU before, during and after, and
the ratios the targets are about (docs/MSGQ.md; on a busy machine the rate moves with the load).
usage: bench/flood.py [--topics 200000] [--flood-s 3] [--phase-s 6] [--transports zmq,shm]"""
import argparse, os, subprocess, sys, threading, time
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENDPOINT, SEGMENT, MSG_SIZE, WORK = "bench_flood", 10 << 20, 50_000, 300_000   # modelV2's segment; WORK: squares summed per message
MB = 1e6

def publisher() -> None:
  import msgq
  pub = msgq.pub_sock(ENDPOINT, SEGMENT)
  body = os.urandom(MSG_SIZE - 8)
  print("up", flush=True)
  i = 0
  while True:
    sum(j * j for j in range(WORK))   # about 20 ms of one core here
    pub.send(i.to_bytes(8, "little") + body)
    i += 1

def flooder(topics: int, seconds: float, port: int) -> None:
  """A hostile subscriber of raw ZMTP 3 (as libzmq's SUB speaks it), at the lowest CPU priority (an attacker's CPU is
  its own machine's): subscribes to `topics` distinct 64-byte topics in chunks of 1,000, paced over `seconds`;
  a connection the publisher closes is made again and the flood goes on with the next chunk."""
  import socket
  from msgq.tcp import GREETING
  os.nice(19)
  body = b"\x05READY\x0bSocket-Type" + (3).to_bytes(4, "big") + b"SUB"
  ready = bytes((4, len(body))) + body
  chunks = [b"".join(b"\x00\x41\x01" + os.urandom(32).hex().encode() for _ in range(1000)) for _ in range(topics // 1000)]
  conn, connections, t0 = None, 0, time.monotonic()
  for i, chunk in enumerate(chunks):
    time.sleep(max(0., t0 + seconds * i / len(chunks) - time.monotonic()))
    while True:
      try:
        if conn is None:
          conn, connections = socket.create_connection(("127.0.0.1", port)), connections + 1
          conn.sendall(GREETING)
          greeting = b""
          while len(greeting) < 64 and (got := conn.recv(64 - len(greeting))): greeting += got
          if len(greeting) < 64: raise ConnectionResetError
          conn.sendall(ready)
        conn.sendall(chunk)
        break
      except (BrokenPipeError, ConnectionResetError):   # closed by the publisher: again, with the next chunk
        conn.close()
        conn = None
  print(f"subscribed {len(chunks) * 1000} in {time.monotonic() - t0:.1f} s over {connections} connection(s)", flush=True)
  sys.stdin.read()   # stays connected until the bench closes our stdin

def rss(pid: int) -> int:
  with open(f"/proc/{pid}/status") as f: return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))

def cpu_s(pid: int) -> tuple[float, float]:
  """CPU seconds of a process: its main thread's, and all its other threads' (libzmq's, msgq's)."""
  main = other = 0.
  for tid in os.listdir(f"/proc/{pid}/task"):
    try:
      with open(f"/proc/{pid}/task/{tid}/stat") as f: fields = f.read().rsplit(")", 1)[1].split()
    except OSError: continue   # a thread that ended
    t = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    if int(tid) == pid: main += t
    else: other += t
  return main, other

def run(kind: str, args) -> dict:
  import zmq
  import msgq
  env = {**os.environ, "PYTHONPATH": REPO, "MSGQ_TRANSPORT": kind, "MSGQ_TCP": "1", "OPENPILOT_PREFIX": f"benchflood{os.getpid()}"}
  os.environ.update(OPENPILOT_PREFIX=env["OPENPILOT_PREFIX"])
  port = msgq.tcp_port(ENDPOINT)
  pub = subprocess.Popen([sys.executable, "-P", __file__, "--child", "pub"], env=env, stdout=subprocess.PIPE, text=True)
  got, samples, stop = [], [], threading.Event()   # (time, sequence number) received; (time, publisher RSS)
  try:
    assert pub.stdout.readline().strip() == "up", "the publisher did not start"
    sub = zmq.Context.instance().socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.setsockopt(zmq.RCVTIMEO, 100)
    sub.connect(f"tcp://127.0.0.1:{port}")
    def receive() -> None:
      while not stop.is_set():
        try: got.append((time.monotonic(), int.from_bytes(sub.recv()[:8], "little")))
        except zmq.Again: pass
    def sample() -> None:
      while not stop.wait(0.05): samples.append((time.monotonic(), rss(pub.pid), *cpu_s(pub.pid)))
    threads = [threading.Thread(target=f, daemon=True) for f in (receive, sample)]
    for t in threads: t.start()
    # warm-up: connected, and on shm the ring written all through (its pages count in the publisher's RSS as it goes)
    while len(got) < SEGMENT // MSG_SIZE + 20: time.sleep(0.1)
    marks = [time.monotonic()]
    time.sleep(args.phase_s)
    marks.append(time.monotonic())
    flood = subprocess.Popen([sys.executable, "-P", __file__, "--child", "flood", str(args.topics), str(args.flood_s), str(port)],
                             env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    said = flood.stdout.readline().strip()   # once all were subscribed; then the during phase runs its length from the flood's start
    time.sleep(max(0., marks[-1] + args.phase_s - time.monotonic()))
    flood.stdin.close(); flood.wait()
    marks.append(time.monotonic())
    time.sleep(args.phase_s)
    marks.append(time.monotonic())
    stop.set()
    for t in threads: t.join()
    sub.close(0)
  finally:
    pub.kill(); pub.wait()
    msgq.remove_stack()
  phases = {}
  for name, (a, b) in zip(("before", "during", "after"), zip(marks, marks[1:])):
    seqs = [s for t, s in got if a <= t < b]
    mem = [m for t, m, _, _ in samples if a <= t < b]
    cpu = [(m, o) for t, _, m, o in samples if a <= t < b]
    phases[name] = {"hz": len(seqs) / (b - a), "lost": (seqs[-1] - seqs[0] + 1 - len(seqs)) if seqs else 0, "rss": mem[-1], "rss_max": max(mem),
                    "main": (cpu[-1][0] - cpu[0][0]) / (b - a), "other": (cpu[-1][1] - cpu[0][1]) / (b - a)}
  return {"phases": phases, "flood": said}

def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--topics", type=int, default=200_000)
  ap.add_argument("--flood-s", type=float, default=3.)
  ap.add_argument("--phase-s", type=float, default=6.)
  ap.add_argument("--transports", default="zmq,shm")
  args = ap.parse_args()
  ratios = []
  for kind in args.transports.split(","):
    r = run(kind, args)
    p, base = r["phases"], r["phases"]["before"]
    for name, ph in p.items():
      print(f"{kind:3s} {name:6s}: {ph['hz']:5.1f} Hz received ({ph['lost']} lost), publisher RSS {ph['rss'] / MB:7.1f} MB at the end, "
            f"{ph['rss_max'] / MB:7.1f} MB at most; its CPU: main thread {ph['main']:.2f}, other threads {ph['other']:.2f} of a core")
    print(f"{kind:3s} flood: {r['flood']}")
    ratios += [f"{kind}: rate during/before {p['during']['hz'] / base['hz']:.2f}, after/before {p['after']['hz'] / base['hz']:.2f} (target >= 0.9)",
               f"{kind}: publisher RSS during {(p['during']['rss_max'] - base['rss']) / MB:+.1f} MB, after {(p['after']['rss'] - base['rss']) / MB:+.1f} MB "
               f"(target <= +5 MB)"]
  for line in ratios: print("ratio", line)

if __name__ == "__main__":
  if sys.argv[1:3] == ["--child", "pub"]: publisher()
  elif sys.argv[1:3] == ["--child", "flood"]: flooder(int(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5]))
  else:
    sys.path[:0] = [REPO]
    main()
