"""Process plumbing for long-running daemons under a service manager (systemd or anything speaking its protocol):
notify() (sd_notify: READY=1, WATCHDOG=1, STATUS=), Watchdog, setup_logging() (one line per record on stderr,
rate-limited), StopFlag (SIGTERM/SIGINT end the loop after its frame), Stats (a summary line per interval, never per frame).
"""
from __future__ import annotations
import argparse, logging, os, signal, socket, statistics, sys, time
from collections import defaultdict
from typing import NoReturn

def _notify_addr() -> str | None:
  addr = os.environ.get('NOTIFY_SOCKET')
  if not addr: return None
  return '\0' + addr[1:] if addr[0] == '@' else addr

_notify_sock: socket.socket | None = None

def notify(*fields: str) -> bool:
  """Send 'FIELD=value' lines as one datagram to $NOTIFY_SOCKET (a path, or '@name' for the abstract namespace): READY=1
  once the daemon serves, WATCHDOG=1 from the work loop, STATUS= a one-line human summary. False if unset, the manager is gone or its queue is full:
  it never raises and never blocks (a frame loop must not stall on a supervisor that does not read)."""
  global _notify_sock
  if (addr := _notify_addr()) is None: return False
  try:
    if _notify_sock is None: _notify_sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
    _notify_sock.sendto('\n'.join(fields).encode(), socket.MSG_DONTWAIT, addr)
    return True
  except OSError as e:
    logging.getLogger(__name__).debug("notify %s failed: %s", fields, e)
    return False

class Watchdog:
  """kick() from the work loop; it sends WATCHDOG=1 at most every WATCHDOG_USEC/2. Inert without $WATCHDOG_USEC, or
  when $WATCHDOG_PID names another process."""
  def __init__(self):
    usec, pid = os.environ.get('WATCHDOG_USEC'), os.environ.get('WATCHDOG_PID')
    ok = usec is not None and usec.isdigit() and int(usec) > 0 and (pid is None or pid == str(os.getpid()))
    self.period = int(usec) / 2e6 if ok else None
    self.last = 0.

  def kick(self) -> None:
    if self.period is not None and (now := time.monotonic()) - self.last >= self.period:
      self.last = now
      notify('WATCHDOG=1')

_PRIORITY = {logging.DEBUG: 7, logging.INFO: 6, logging.WARNING: 4, logging.ERROR: 3, logging.CRITICAL: 2}

class _Formatter(logging.Formatter):
  def __init__(self, journald: bool):
    super().__init__()
    self.journald = journald

  def format(self, record: logging.LogRecord) -> str:
    msg = record.getMessage()
    if record.exc_info: msg += ' ' + self.formatException(record.exc_info).replace('\n', ' | ')
    msg = msg.replace('\n', ' | ')   # one record, one line: journald and grep see it whole
    head = f"<{_PRIORITY.get(record.levelno, 6)}>" if self.journald else time.strftime('%Y-%m-%dT%H:%M:%S', time.localtime(record.created)) + ' '
    return f"{head}{record.levelname.lower()} {record.name}: {msg}"

class _Site:
  """One call site's state in RateLimit."""
  def __init__(self, tokens: float, now: float):
    self.tokens, self.t = tokens, now            # messages it may still show now, as of time t
    self.held, self.last = 0, None               # held back since its last message shown, and the last of them

class RateLimit(logging.Filter):
  """Warnings and errors: the same message (logger, level and text) at most once per `interval` s, and of one call
  site (logger and message template) a burst of at most `burst` distinct messages, then one per `interval` s. So
  distinct diagnostics logged together (a reason per camera, per damaged file) all show, while a broken producer at
  100 Hz, whose messages differ only in a count or a frame id, cannot flood the journal. The next message of a call
  site that passes says how many were held back; held_back() gives, per call site, the last one still held back with
  the count (setup_logging's handler logs them at exit)."""
  def __init__(self, interval: float = 10., burst: int = 10):
    super().__init__()
    self.interval, self.burst = interval, burst
    self.shown: dict[tuple, float] = {}   # (logger, level, message) -> when it was last let through
    self.sites: dict[tuple, _Site] = {}   # (logger, template) -> its state

  def filter(self, record: logging.LogRecord) -> bool:
    if record.levelno < logging.WARNING: return True
    now, msg = record.created, record.getMessage()
    if (site := self.sites.get(where := (record.name, record.msg))) is None: site = self.sites[where] = _Site(self.burst, now)
    site.tokens, site.t = min(self.burst, site.tokens + (now - site.t) / self.interval), now   # one back per interval
    if site.tokens < 1 or now - self.shown.get(key := (record.name, record.levelno, msg), -self.interval) < self.interval:
      site.held, site.last = site.held + 1, record
      return False
    site.tokens -= 1
    if len(self.shown) > 1000: self.shown = {k: t for k, t in self.shown.items() if now - t < self.interval}   # stays bounded
    self.shown[key] = now
    if site.held: record.msg, record.args = f"{msg} ({site.held} more like this held back)", None
    site.held, site.last = 0, None
    return True

  def held_back(self) -> list[logging.LogRecord]:
    """Per call site with messages held back since its last one shown, the last of them saying how many there were;
    their counts start again."""
    out = []
    for site in self.sites.values():
      if site.held:
        out.append(rec := logging.makeLogRecord(site.last.__dict__))
        rec.msg, rec.args = f"{site.last.getMessage()} (the last of {site.held} held back)", None
        site.held, site.last = 0, None
    return out

class _Handler(logging.StreamHandler):
  """stderr, rate-limited; at close (logging.shutdown at exit) it writes what the rate limit still holds back."""
  def __init__(self, rate_limit: RateLimit):
    super().__init__(sys.stderr)
    self.rate_limit = rate_limit
    self.addFilter(rate_limit)

  def close(self) -> None:
    for rec in self.rate_limit.held_back(): self.emit(rec)
    self.flush()
    super().close()

def add_log_level(ap: argparse.ArgumentParser, detail: str = "") -> None:
  """Every command's --log-level (setup_logging's level); detail: what DEBUG adds."""
  ap.add_argument('--log-level', default='INFO', type=str.upper, choices=['DEBUG', 'INFO', 'WARNING', 'ERROR'],
                  help=f"stderr log level: DEBUG, INFO, WARNING or ERROR (default INFO{'; DEBUG adds ' + detail if detail else ''})")

def setup_logging(level: str | int = 'INFO', rate_limit: float = 10.) -> None:
  """One line per record on stderr: under journald ($JOURNAL_STREAM set) each line starts with the syslog priority '<N>'
  so the journal keeps the level, elsewhere with a timestamp; values go as key=value. Repeated warnings and errors are
  rate-limited (RateLimit); what is still held back is written at exit."""
  root = logging.getLogger()
  for h in list(root.handlers):
    root.removeHandler(h)
    if isinstance(h, _Handler): h.close()   # what it holds back is written, not lost
  h = _Handler(RateLimit(rate_limit))
  h.setFormatter(_Formatter(journald=bool(os.environ.get('JOURNAL_STREAM'))))
  root.addHandler(h)
  root.setLevel(level.upper() if isinstance(level, str) else level)

def set_process_title(name: str) -> None:
  import setproctitle
  setproctitle.setproctitle(name)

class StopFlag:
  """True once SIGTERM or SIGINT arrived. The handler only sets the flag: blocking receives in the loop time out
  (100 ms) and the loop ends after the frame in progress."""
  def __init__(self, signals=(signal.SIGTERM, signal.SIGINT)):
    self.signum: int | None = None
    for s in signals: signal.signal(s, self._handle)

  def _handle(self, signum, frame) -> None: self.signum = signum
  def __bool__(self) -> bool: return self.signum is not None

class Stats:
  """Periodic summary: `count(k)`, `gauge(k, v)`, `timing(k, seconds)`; `tick()` logs and clears every `interval` s.
  The rate is that of the counter `rate_key`. `set_state(s)` leads every STATUS= from then on (what the process is
  doing: waiting for a camera, serving one), sent at once. So a healthy daemon logs a line per interval, never one per
  frame; STATUS= carries that line and the counters' totals since the start (a manager that missed a datagram still
  reads exact totals from the next)."""
  def __init__(self, logger: logging.Logger, interval: float = 10., rate_key: str = 'frames'):
    self.logger, self.interval, self.rate_key, self.state = logger, interval, rate_key, ''
    self.counts: dict[str, int] = defaultdict(int)
    self.totals: dict[str, int] = defaultdict(int)
    self.gauges: dict[str, float] = {}
    self.times: dict[str, list[float]] = defaultdict(list)
    self.t0 = time.monotonic()

  def count(self, key: str, n: int = 1) -> None:
    self.counts[key] += n
    self.totals[key] += n
  def gauge(self, key: str, value: float) -> None: self.gauges[key] = value
  def timing(self, key: str, seconds: float) -> None: self.times[key].append(seconds)

  def summary(self, dt: float) -> str:
    parts = [f"rate={self.counts.get(self.rate_key, 0) / dt:.1f}Hz"] if dt > 0 else []
    parts += [f"{k}={v}" for k, v in sorted(self.counts.items())]
    parts += [f"{k}={v:.2f}" for k, v in sorted(self.gauges.items())]
    parts += [f"{k}_ms_p50={statistics.median(v) * 1e3:.1f} {k}_ms_max={max(v) * 1e3:.1f}" for k, v in sorted(self.times.items()) if v]
    return ' '.join(parts)

  def totals_line(self) -> str: return ' '.join(f"{k}={v}" for k, v in sorted(self.totals.items())) or 'nothing counted'

  def _status(self, line: str) -> None: notify(f"STATUS={self.state}{'; ' if self.state and line else ''}{line} | totals {self.totals_line()}")

  def set_state(self, state: str) -> None:
    if state != self.state:
      self.state = state
      self._status('')

  def tick(self) -> None:
    if (dt := (now := time.monotonic()) - self.t0) < self.interval: return
    line = self.summary(dt)
    self.logger.info("stats %s", line)
    self._status(line)
    self.counts.clear()
    self.times.clear()
    self.t0 = now

def exit_now(code: int) -> NoReturn:
  """End the process at once with `code`, after flushing logs and stdio. For a daemon that has closed everything it
  owns: the interpreter's own teardown (freeing tinygrad's object graphs: ~0.4 s here) would eat the stop budget."""
  logging.shutdown()
  for f in (sys.stdout, sys.stderr):
    try: f.flush()
    except (OSError, ValueError): pass
  os._exit(code)

def reader_left() -> None:
  """stdout's reader has gone (`modeld-dump ... | head`): what is left to print goes nowhere, quietly (no
  BrokenPipeError at exit), and the command keeps its exit status."""
  os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
