#!/usr/bin/env python3
"""Restarts as openpilot's harnesses make them (tests/daemon_harness.py Harness): each daemon started anew RESTARTS times
on each transport, with a new camera server, publishers and subscribers (as openpilot's modeld test sets up each test);
its inputs' readers awaited, then frame 1. Prints when the readers came and when frame 1 was answered (seconds from the
start), then, last, frame 1 answered per restart (target 1.00); docs/MSGQ.md has the figures."""
import contextlib, io, os, pathlib, sys, uuid
REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
import numpy as np

RESTARTS = 20

def main() -> None:
  os.environ['OPENPILOT_PREFIX'] = f"bench-harness-{uuid.uuid4().hex[:8]}"
  from msgq import remove_stack
  from tests.artifacts import CACHE, build
  from tests.daemon_harness import driver_harness, road_harness
  artifacts, ratios = build(CACHE.parent / 'tiny', models='tiny'), []
  try:
    for transport in ('zmq', 'shm'):
      os.environ['MSGQ_TRANSPORT'] = transport
      for name, harness in (('modeld', road_harness), ('dmonitoringd', driver_harness)):
        readers, answers = [], []
        for _ in range(RESTARTS):
          h = harness(artifacts)
          try: r, a = h.frame_one()
          finally:
            with contextlib.redirect_stdout(io.StringIO()): h.close()   # the daemon's log
          readers.append(r)
          if a is not None: answers.append(a)
        print(f"{name:12s} {transport}: readers after p50 {np.median(readers):.2f} s max {max(readers):.2f} s; frame 1 answered in "
              f"{len(answers)} of {RESTARTS} starts, after p50 {np.median(answers) if answers else float('nan'):.2f} s")
        ratios.append(f"{name} {transport}: frame 1 answered per start {len(answers) / RESTARTS:.2f} (target 1.00)")
  finally: remove_stack()
  for r in ratios: print("ratio", r)

if __name__ == "__main__":
  main()
