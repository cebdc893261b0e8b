"""A replay's CPU kernels on N threads in one native call: a team of pthreads takes each kernel's launches from an
atomic counter (uneven launches balance themselves) and meets at a spinning barrier before the next kernel, so a
kernel costs a few microseconds of synchronisation, not Python's (a threading.Barrier: tens of microseconds and the
GIL). Built with clang (tinygrad's CPU backend needs it) once per source, cached beside tinygrad's cache."""
from __future__ import annotations
import ctypes, hashlib, os, pathlib, subprocess, tempfile, threading
import numpy as np

MAX_ARGS = 32   # a kernel is called with this many integer arguments, its own first (the C calling conventions of
                # x86-64 and arm64 let a caller pass more than a function takes: the callee reads its own)

SOURCE = r"""
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>
#if defined(__x86_64__)
#define RELAX() __builtin_ia32_pause()
#elif defined(__aarch64__)
#define RELAX() __asm__ volatile("yield")
#else
#define RELAX()
#endif
#define A(i) a[i]
typedef uint64_t u64;
typedef void (*kernel)(u64,u64,u64,u64,u64,u64,u64,u64,u64,u64,u64,u64,u64,u64,u64,u64,
                       u64,u64,u64,u64,u64,u64,u64,u64,u64,u64,u64,u64,u64,u64,u64,u64);
typedef struct { void *fn; u64 n; u64 *args; } step;   /* args: n launches x 32 */
typedef struct {
  int n, stop; pthread_t *th; pthread_mutex_t mu; pthread_cond_t cv; u64 gen;
  struct run { const step *steps; int nsteps; _Atomic u64 *next; u64 *times; } run; u64 last_end;
  _Atomic int count, sense; int main_sense;
} team;
typedef struct { team *t; int id; } worker_arg;
static u64 now_ns(void) { struct timespec ts; clock_gettime(CLOCK_MONOTONIC, &ts); return ts.tv_sec * 1000000000ull + ts.tv_nsec; }

static void call(const step *s, u64 i) {
  const u64 *a = s->args + i * 32;
  ((kernel)s->fn)(A(0),A(1),A(2),A(3),A(4),A(5),A(6),A(7),A(8),A(9),A(10),A(11),A(12),A(13),A(14),A(15),
                  A(16),A(17),A(18),A(19),A(20),A(21),A(22),A(23),A(24),A(25),A(26),A(27),A(28),A(29),A(30),A(31));
}
typedef struct run run;   /* what one team_run does */
/* times (or NULL): per step, each thread's ns in its launches, then the step's own, from the end of the barrier before
   it (or the run's start) to the end of its barrier, which the last thread to arrive there records */
static void barrier(team *t, const run *r, int k, int *sense) {
  *sense = !*sense;
  if (atomic_fetch_add(&t->count, 1) == t->n - 1) {
    if (r->times) { u64 e = now_ns(); r->times[k * (t->n + 1) + t->n] = e - t->last_end; t->last_end = e; }
    atomic_store(&t->count, 0); atomic_store(&t->sense, *sense);
  } else for (int spins = 0; atomic_load_explicit(&t->sense, memory_order_acquire) != *sense; spins++)
    if (spins < 4096) RELAX(); else sched_yield();   /* more threads than free cores: let the one with work run */
}
/* a copy of the run, not the team's: a thread still leaving the last barrier must not see the next run's steps */
static void work(team *t, run r, int id, int *sense) {
  for (int k = 0; k < r.nsteps; k++) {
    const step *s = &r.steps[k];
    u64 t0 = r.times ? now_ns() : 0;
    for (u64 i; (i = atomic_fetch_add(&r.next[k], 1)) < s->n;) call(s, i);
    if (r.times) r.times[k * (t->n + 1) + id] = now_ns() - t0;
    barrier(t, &r, k, sense);
  }
}
static void *worker(void *p) {
  team *t = ((worker_arg *)p)->t; int id = ((worker_arg *)p)->id, sense = 0; u64 seen = 0;
  free(p);
  for (;;) {
    pthread_mutex_lock(&t->mu);
    while (t->gen == seen && !t->stop) pthread_cond_wait(&t->cv, &t->mu);
    seen = t->gen;
    int stop = t->stop;
    run r = t->run;
    pthread_mutex_unlock(&t->mu);
    if (stop) return 0;
    work(t, r, id, &sense);
  }
}
team *team_new(int n) {
  team *t = calloc(1, sizeof(team));
  t->n = n; t->th = calloc(n, sizeof(pthread_t));
  pthread_mutex_init(&t->mu, 0); pthread_cond_init(&t->cv, 0);
  for (int i = 1; i < n; i++) {
    worker_arg *a = malloc(sizeof(worker_arg)); a->t = t; a->id = i;
    if (pthread_create(&t->th[i], 0, worker, a)) { free(a); t->n = i; break; }
  }
  return t;
}
int team_size(team *t) { return t->n; }
/* the steps in order, each kernel's launches shared out; returns once all are done */
void team_run(team *t, const step *steps, int nsteps, _Atomic u64 *next, u64 *times) {
  for (int k = 0; k < nsteps; k++) atomic_store(&next[k], 0);
  pthread_mutex_lock(&t->mu);
  t->run = (run){steps, nsteps, next, times}; t->last_end = times ? now_ns() : 0; t->gen++;
  pthread_cond_broadcast(&t->cv);
  pthread_mutex_unlock(&t->mu);
  work(t, t->run, 0, &t->main_sense);
}
void team_free(team *t) {
  pthread_mutex_lock(&t->mu); t->stop = 1; pthread_cond_broadcast(&t->cv); pthread_mutex_unlock(&t->mu);
  for (int i = 1; i < t->n; i++) pthread_join(t->th[i], 0);
  free(t->th); free(t);
}
"""

class Step(ctypes.Structure):
  _fields_ = [('fn', ctypes.c_void_p), ('n', ctypes.c_uint64), ('args', ctypes.POINTER(ctypes.c_uint64))]

def _build() -> ctypes.CDLL:
  """The library, compiled once per source into the cache (a private temporary folder where that is not writable)."""
  name = f"replay_threads-{hashlib.sha256(SOURCE.encode()).hexdigest()[:16]}.so"
  cache = pathlib.Path(os.environ.get('XDG_CACHE_HOME') or pathlib.Path.home() / '.cache') / 'tinymodeld'
  for d in (cache, None):
    try:
      if d is None: d = pathlib.Path(tempfile.mkdtemp(prefix='tinymodeld-'))
      if not (so := d / name).exists():
        d.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=d) as tmp:   # built aside, then renamed: a concurrent build never sees half a file
          (src := pathlib.Path(tmp) / 'threads.c').write_text(SOURCE)
          subprocess.run(['clang', '-O2', '-shared', '-fPIC', '-pthread', '-o', str(src.with_suffix('.so')), str(src)], check=True,
                         capture_output=True)
          os.replace(src.with_suffix('.so'), so)
      lib = ctypes.CDLL(str(so))
      break
    except OSError:
      if d is not cache: raise
  lib.team_new.argtypes, lib.team_new.restype = [ctypes.c_int], ctypes.c_void_p
  lib.team_size.argtypes, lib.team_size.restype = [ctypes.c_void_p], ctypes.c_int
  lib.team_run.argtypes, lib.team_run.restype = [ctypes.c_void_p, ctypes.POINTER(Step), ctypes.c_int, ctypes.POINTER(ctypes.c_uint64),
                                                 ctypes.c_void_p], None
  lib.team_free.argtypes, lib.team_free.restype = [ctypes.c_void_p], None
  return lib

_lib: ctypes.CDLL | None = None
_teams: dict[int, Team] = {}
_lock = threading.Lock()

class Team:
  """n threads (the caller's and n - 1 pthreads) that run plans; replays on other Python threads take turns."""
  def __init__(self, n: int):
    global _lib
    if _lib is None: _lib = _build()
    self.n, self.lib, self.handle, self.lock = n, _lib, _lib.team_new(n), threading.Lock()
    if (got := _lib.team_size(self.handle)) != n: raise OSError(f"replay threads: expected {n} threads, could start {got}")

  def run(self, plan: Plan, times: np.ndarray | None = None) -> None:
    """times: a uint64 array (len(plan.steps), n + 1) to fill, per kernel, with each thread's nanoseconds in its
    launches and the kernel's own, from the end of the barrier before it to the end of its own (Replay.thread_times)."""
    assert times is None or (times.dtype == np.uint64 and times.shape == (len(plan.steps), self.n + 1) and times.flags.c_contiguous)
    with self.lock: self.lib.team_run(self.handle, plan.steps, len(plan.steps), plan.next, None if times is None else times.ctypes.data)

def team(n: int) -> Team:
  """The process's team of n threads, started at first use."""
  with _lock:
    if (t := _teams.get(n)) is None: t = _teams[n] = Team(n)
    return t

class Plan:
  """Kernels for a team: each one's function and its launches' arguments (MAX_ARGS each) in native memory, and where
  the replay's input addresses go (set() before each run)."""
  def __init__(self, kernels: list[tuple[int, list[list[int]], list[tuple[int, int]]]], names: list[str]):
    """kernels: (function address, each launch's argument values, [(argument index, input slot)]); names: theirs."""
    self.names, self.steps, self.next = names, (Step * len(kernels))(), (ctypes.c_uint64 * len(kernels))()
    self.args, self.inputs = [], []
    for k, (fn, launches, inputs) in enumerate(kernels):
      if any(len(a) > MAX_ARGS for a in launches): raise ValueError(f"a kernel of {max(map(len, launches))} arguments: at most {MAX_ARGS} go natively")
      args = (ctypes.c_uint64 * (MAX_ARGS * len(launches)))(*[v for a in launches for v in a + [0] * (MAX_ARGS - len(a))])
      self.steps[k] = Step(fn, len(launches), args)
      self.args.append(args)   # kept alive as long as the steps point at them
      self.inputs += [(args, l * MAX_ARGS + j, slot) for l in range(len(launches)) for j, slot in inputs]

  def set(self, addrs: list[int]) -> None:
    for args, i, slot in self.inputs: args[i] = addrs[slot]
