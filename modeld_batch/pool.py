"""The job's workers (SegmentWorker actors) and its segments in flight, through the loss of a worker or its node.

A lost worker's segments go back to the queue, a new worker starts in its place wherever Ray finds a free core
(waiting for one, if none is), and the segment it was running counts one lost run: RETRIES re-runs, then it fails.
"""
from __future__ import annotations
from collections import Counter
from dataclasses import asdict, dataclass, field
from collections.abc import Callable
from typing import Any
import ray
from ray.exceptions import ActorUnavailableError, RayActorError, RayError

RETRIES = 3   # a segment whose worker is lost while running it (its node or process died) is run again this often

@dataclass(eq=False)
class Worker:
  """A worker as the job sees it: starting until it answers where it runs (its artifacts loaded), then ready."""
  actor: Any
  starts: int                   # starts lost in a row in its place before it (a ready worker's replacement: 0)
  where: str = ""               # "pid N on IP", once ready
  jobs: list = field(default_factory=list)   # the segments sent to it, in order: the first (Pool.slots) are running
  lost: bool = False
  why: str = ""                 # once lost: why (loss_reason)
  running: list = field(default_factory=list)   # once lost: the segments it was running, those whose runs its loss costs

def loss_reason(e: RayActorError) -> str:
  """Why a worker was lost, in words that add up over workers (Ray's own message names the actor and its address)."""
  if "node has died" in (msg := str(e)): return "worker lost: its node died"
  if isinstance(e, ActorUnavailableError): return "worker lost: it stopped answering (its node or process gone)"
  return "worker lost: its process died" + (" (its node low on memory)" if "low on memory" in msg else "")

class Pool:
  """Segments go to ready workers, two at a time each while more wait than there are workers (the second starts as the
  first ends, without a round trip through the driver); near the end one at a time, so none waits behind a long one
  while another worker idles. A worker of `slots` (modeld-batch --batch-frames) runs that many at a time: each count
  above is per slot. A worker is lost when a call to it fails for its process or node (not for its
  segment: a segment's own error is its result): every call to it still out then fails too, and none of those counts
  again. A worker that keeps dying while it starts (RETRIES + 1 times in a row in its place) is not replaced."""
  def __init__(self, new_actor: Callable[[], Any], n: int, queue: list, log: Callable[[str], None], slots: int = 1):
    self.new_actor, self.queue, self.log, self.slots = new_actor, queue, log, slots
    self.ready: list[Worker] = []
    self.starting: dict[Any, Worker] = {}             # where() call -> its worker
    self.pending: dict[Any, tuple[Worker, Any]] = {}  # replay() call -> its worker and segment
    self.actors: list = []                            # every actor started: what an interrupted job stops
    self.lost_runs: Counter[str] = Counter()          # segment output -> its runs lost with their worker
    self.lost_why: dict[str, str] = {}                # segment output -> why its last run was lost, until it runs again
    self.reruns: list[tuple[str, str]] = []           # (route, why) of each segment sent again after its worker was lost
    for _ in range(n): self.start(0)

  def start(self, starts: int) -> None:
    w = Worker(self.new_actor(), starts)
    self.actors.append(w.actor)
    self.starting[w.actor.where.remote()] = w

  def dispatch(self) -> None:
    while self.queue and self.ready:
      w = min(self.ready, key=lambda w: len(w.jobs))
      if len(w.jobs) >= self.slots * (2 if len(self.queue) > len(self.ready) * self.slots else 1): break
      w.jobs.append(j := self.queue.pop(0))
      if j.out in self.lost_why: self.reruns.append((j.route, self.lost_why.pop(j.out)))
      self.pending[w.actor.replay.remote(asdict(j))] = (w, j)

  def wait(self) -> Any:
    """The next call to finish, a worker's start or a segment; None where none is out (every worker lost, none may
    start again)."""
    return ray.wait([*self.pending, *self.starting], num_returns=1)[0][0] if self.pending or self.starting else None

  def started(self, ref: Any) -> Worker | None:
    """A worker's start that finished: the worker, ready; None where it was lost (RayActorError where its __init__
    failed: the artifacts cannot load, which no other worker would do better)."""
    w = self.starting.pop(ref)
    try: w.where = ray.get(ref)
    except RayActorError as e:
      if e.actor_init_failed: raise
      self.lose(w, e)
      return None
    self.ready.append(w)
    return w

  def result(self, ref: Any) -> tuple[Any, dict | None]:
    """A segment's call that finished: its segment and its result (counts, or {"error": ...}), or None where the
    segment went back to the queue, its worker lost."""
    w, j = self.pending.pop(ref)
    try: r = ray.get(ref)
    except RayActorError as e:
      self.lose(w, e)
      r = None
    except RayError as e: r = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"}
    w.jobs.remove(j)
    if r is None and j in w.running:   # the runs its worker's loss costs
      self.lost_runs[j.out] += 1
      if (n := self.lost_runs[j.out]) > RETRIES:
        self.log(f"modeld-batch: {j.route}--{j.n} failed: its worker was lost {n} times")
        return j, {"error": f"its worker was lost {n} times, the last: {w.why}"}
      self.lost_why[j.out] = w.why
    if r is None: self.queue.insert(0, j)   # a segment run again goes first: it is late already
    return j, r

  def lose(self, w: Worker, e: RayActorError) -> None:
    """w failed for its process or node, once: it is stopped (one that stopped answering may still run, and write), the
    segment it was running is the one charged, and a new worker starts in its place while segments wait and its place
    has starts left. Its other calls fail as they come in, and go back to the queue uncharged."""
    if w.lost: return
    w.lost, w.why, w.running = True, loss_reason(e), w.jobs[:self.slots]
    ray.kill(w.actor, no_restart=True)
    if w in self.ready: self.ready.remove(w)
    starts = 0 if w.where else w.starts + 1
    replace = bool(self.queue or w.jobs) and starts <= RETRIES
    self.log(f"modeld-batch: {'worker ' + w.where if w.where else 'a starting worker'}: {w.why} ({type(e).__name__})" +
             "".join(f"; {j.route}--{j.n} back to the queue" for j in w.jobs) + ("; a new worker starts when a core is free" if replace else ""))
    if replace: self.start(starts)
