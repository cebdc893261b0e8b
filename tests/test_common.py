"""service: the service-manager notify protocol over real datagram sockets, the watchdog, stderr logging,
the signal stop flag and the periodic stats, in this process and in child processes."""
import logging, os, signal, socket, subprocess, sys, textwrap, time
import pytest
from service import Stats, Watchdog, notify

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

@pytest.fixture(params=['path', 'abstract'])
def manager(request, tmp_path, monkeypatch):
  """A listening notify socket; NOTIFY_SOCKET names it (a file path, or '@name' in the abstract namespace)."""
  s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
  if request.param == 'path':
    s.bind(addr := str(tmp_path / 'notify'))
  else:
    name = f"test-notify-{os.getpid()}-{time.monotonic_ns()}"
    s.bind('\0' + name)
    addr = '@' + name
  s.settimeout(2)
  monkeypatch.setenv('NOTIFY_SOCKET', addr)
  yield s
  s.close()

def test_notify_sends_one_datagram(manager):
  assert notify('READY=1', 'STATUS=warming up')
  assert manager.recv(4096) == b'READY=1\nSTATUS=warming up'

def test_notify_never_blocks_on_a_manager_that_does_not_read(manager):
  t0 = time.monotonic()
  sent = [notify('WATCHDOG=1') for _ in range(5000)]
  assert time.monotonic() - t0 < 2 and sent[0] and not sent[-1]   # the queue filled up: dropped, not blocked
  assert manager.recv(64) == b'WATCHDOG=1'

def test_notify_without_or_with_a_dead_manager(monkeypatch, tmp_path):
  monkeypatch.delenv('NOTIFY_SOCKET', raising=False)
  assert not notify('READY=1')
  monkeypatch.setenv('NOTIFY_SOCKET', str(tmp_path / 'gone'))   # nobody listens: a daemon keeps running
  assert not notify('READY=1')

def test_watchdog_kicks_at_half_the_period(manager, monkeypatch):
  monkeypatch.setenv('WATCHDOG_USEC', '200000')
  wd = Watchdog()
  wd.kick()
  assert manager.recv(64) == b'WATCHDOG=1'
  wd.kick()   # too soon: nothing
  manager.settimeout(0.05)
  with pytest.raises(TimeoutError): manager.recv(64)
  time.sleep(0.11)
  wd.kick()
  assert manager.recv(64) == b'WATCHDOG=1'

@pytest.mark.parametrize('env', [{}, {'WATCHDOG_USEC': '200000', 'WATCHDOG_PID': '1'}, {'WATCHDOG_USEC': 'x'}])
def test_watchdog_inert_unless_meant_for_us(manager, monkeypatch, env):
  monkeypatch.delenv('WATCHDOG_USEC', raising=False)
  for k, v in env.items(): monkeypatch.setenv(k, v)
  Watchdog().kick()
  manager.settimeout(0.05)
  with pytest.raises(TimeoutError): manager.recv(64)

def _child(code: str, env: dict | None = None, **kw) -> subprocess.Popen:
  env = {k: v for k, v in os.environ.items() if k != 'JOURNAL_STREAM'} | (env or {})
  return subprocess.Popen([sys.executable, '-c', textwrap.dedent(code)], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)

LOG = """
import logging
from service import setup_logging
setup_logging('INFO')
logging.getLogger('modeld').info('stats rate=%.1fHz', 20.0)
logging.getLogger('modeld').debug('not shown')
logging.getLogger('modeld').error('two\\nlines')
"""

def test_logging_terminal_and_journald():
  out = _child(LOG).communicate(timeout=20)[1].splitlines()
  assert len(out) == 2 and out[0].endswith('info modeld: stats rate=20.0Hz') and out[1].endswith('error modeld: two | lines')
  assert out[0][:4].isdigit()   # a timestamp first on a terminal
  out = _child(LOG, {'JOURNAL_STREAM': '8:1234'}).communicate(timeout=20)[1].splitlines()
  assert out == ['<6>info modeld: stats rate=20.0Hz', '<3>error modeld: two | lines']   # journald keeps the priority

def test_repeated_warnings_are_rate_limited():
  """A call site's messages: a burst of 10 distinct ones, then one per interval, the next shown saying how many were
  held back; what is still held back at exit is written then, with its count."""
  out = _child("""
    import logging, time
    from service import setup_logging
    setup_logging('DEBUG', rate_limit=0.3)
    log = logging.getLogger('modeld')
    for i in range(100):
      log.warning('bad message %d', i)
      log.debug('frame %d', i)   # debug lines are never held back
    log.error('other site')
    time.sleep(0.35)
    log.warning('bad message %d', 100)
    log.warning('bad message %d', 101)
    log.warning('bad message %d', 102)
  """).communicate(timeout=20)[1].splitlines()
  warnings = [l.split(': ', 1)[1] for l in out if ' warning ' in l]
  assert warnings == [f'bad message {i}' for i in range(10)] + ['bad message 100 (90 more like this held back)',
                                                                 'bad message 102 (the last of 2 held back)'], out
  assert sum(' debug ' in l for l in out) == 100 and sum(l.endswith('error modeld: other site') for l in out) == 1

def test_distinct_diagnostics_all_show_and_real_repeats_do_not():
  """Distinct messages of one call site logged together all show (one reason per camera, per damaged file, even
  through a '%s' template); the same message again within the interval is held back and counted at exit."""
  out = _child("""
    import logging
    from service import setup_logging
    setup_logging('INFO')
    log = logging.getLogger('camerad')
    log.warning('not served: %s', 'driver: no dcamera.hevc')
    log.warning('not served: %s', 'wide: no wideRoadEncodeIdx events')
    for seg in range(3): logging.getLogger('oproute').warning('%s', f'r--{seg}/rlog.zst: 10 bytes are not a whole message')
    for _ in range(50): log.error('lockstep: no answer')
  """).communicate(timeout=20)[1].splitlines()
  msgs = [l.split(' ', 1)[1] for l in out]
  assert msgs == ['warning camerad: not served: driver: no dcamera.hevc', 'warning camerad: not served: wide: no wideRoadEncodeIdx events',
                  *[f'warning oproute: r--{seg}/rlog.zst: 10 bytes are not a whole message' for seg in range(3)],
                  'error camerad: lockstep: no answer', 'error camerad: lockstep: no answer (the last of 49 held back)'], out

def test_stop_flag_ends_the_loop_on_sigterm_and_sigint():
  for sig in (signal.SIGTERM, signal.SIGINT):
    p = _child("""
      import time
      from service import StopFlag, set_process_title
      set_process_title('stoptest')
      stop = StopFlag()
      print('up', flush=True)
      while not stop: time.sleep(0.01)
      print('stopped by', stop.signum, flush=True)
    """)
    assert p.stdout.readline() == 'up\n'
    assert open(f'/proc/{p.pid}/cmdline', 'rb').read().split(b'\0')[0] == b'stoptest'
    t0 = time.monotonic()
    p.send_signal(sig)
    out, err = p.communicate(timeout=5)
    assert p.returncode == 0 and out == f'stopped by {int(sig)}\n', err
    assert time.monotonic() - t0 < 1

def test_stats_summarise_per_interval(manager, caplog):
  stats = Stats(logging.getLogger('t'), interval=0.05)
  for _ in range(4):
    stats.count('frames')
    stats.timing('exec', 0.010)
  stats.count('dropped', 2)
  stats.gauge('frame_drop_perc', 1.5)
  def tick() -> str | None:
    """The stats line the tick logged, if it logged one."""
    n = len(caplog.records)
    stats.tick()
    assert len(caplog.records) - n <= 1 and all(r.getMessage().startswith('stats ') for r in caplog.records[n:])
    return caplog.records[-1].getMessage().removeprefix('stats ') if len(caplog.records) > n else None
  caplog.set_level(logging.INFO)
  assert tick() is None   # the interval has not passed: nothing logged
  time.sleep(0.06)
  line = tick()
  assert 'dropped=2 frames=4 frame_drop_perc=1.50 exec_ms_p50=10.0 exec_ms_max=10.0' in line and line.startswith('rate=')
  assert manager.recv(4096).decode() == f'STATUS={line} | totals dropped=2 frames=4'
  assert stats.totals == {'frames': 4, 'dropped': 2} and not stats.counts   # the next interval starts empty
  stats.count('frames')
  time.sleep(0.06)
  line = tick()
  assert line.startswith('rate=') and ' frames=1 ' in f'{line} ' and 'dropped' not in line
  assert manager.recv(4096).decode() == f'STATUS={line} | totals dropped=2 frames=5'
  stats.set_state('serving x')   # sent at once, then leading every stats line
  stats.set_state('serving x')   # no change: nothing sent
  assert manager.recv(4096).decode() == 'STATUS=serving x | totals dropped=2 frames=5'
  time.sleep(0.06)
  line = tick()
  assert manager.recv(4096).decode() == f'STATUS=serving x; {line} | totals dropped=2 frames=5'
