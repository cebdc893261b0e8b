"""The fault battery's fast part, with the real daemons, real sockets and real processes (the long runs: scripts/soak.sh):
a broken artifact fails at once, unparseable model outputs never crash a daemon, malformed messages on every input cost
no output, and the recorder on a full disk stops with a clear error and leaves readable segments."""
import re, subprocess, sys, time
import numpy as np
import pytest
from cereal import messaging
from cereal.services import CAMERA_STATE_SERVICES
from msgq.visionipc import ROAD, WIDE_ROAD, DRIVER
from tests.artifacts import CACHE, LAYOUT, REPO, build
from tests.daemon_harness import Camera, Collector, Daemon, Notify, start_daemon
from tests.faults import ARTIFACT_DAMAGES, MESSAGE_FAULTS, MessageFaults, can_mount_tmpfs, damaged_artifact, full_disk
from modeld_common.daemon import EX_CONFIG
from modeld_common.frame import MAX_BAD_OUTPUTS
from modelrt.contracts import lookup
from modeld.model import RoadModel
from dmonitoringd.model import DriverModel
from oproute.logreader import LogReader, segment_dirs

DAEMONS = {'modeld': (RoadModel, 'road', {ROAD: LAYOUT, WIDE_ROAD: LAYOUT}), 'dmonitoringd': (DriverModel, 'dm', {DRIVER: LAYOUT})}

@pytest.mark.parametrize('damage', ARTIFACT_DAMAGES)
@pytest.mark.parametrize('daemon', DAEMONS)
def test_a_damaged_artifact_exits_78_before_waiting_for_a_camera(daemon, damage, tiny_artifacts, tmp_path):
  """Altered weights, or a manifest with a key missing, a field of the wrong type or an output slice that is no
  [start, stop]. No camera server at all: the daemon can only have checked the artifact first. The message is the
  loader's, naming the file or the manifest field; never a traceback."""
  bad = tmp_path / 'artifacts'
  msg = damaged_artifact(tiny_artifacts, bad, family := DAEMONS[daemon][1], damage)
  notify = Notify()
  d = Daemon(daemon, bad, notify=notify)
  try:
    rc = d.proc.wait(60)
    states = notify.wait('STATUS=stopped', 5)
  finally:
    d.stop()
    notify.close()
  err = d.stderr()
  assert rc == EX_CONFIG, err
  assert f"ArtifactError: {bad / family}: {msg}. Rebuild with: " in err, err
  # waiting for a camera is the first state a daemon reports: it never got there
  assert states == ['STATUS=stopped | totals nothing counted'] and 'Traceback' not in err

@pytest.mark.parametrize('daemon', DAEMONS)
@pytest.mark.parametrize('transport', ['zmq', 'shm'])
def test_a_second_daemon_on_the_same_prefix_takes_over_and_the_first_says_so_and_exits_1(daemon, transport, tiny_artifacts, monkeypatch):
  """openpilot's rule, the newest publisher wins: the second one's outputs take the endpoints; the first one, idle
  (waiting for a camera), notices at its next tick, says so in one line naming the endpoint, never a traceback, and
  exits 1; the second one keeps running."""
  monkeypatch.setenv('MSGQ_TRANSPORT', transport)
  notify, notify2 = Notify(), Notify()
  first, second = Daemon(daemon, tiny_artifacts, notify=notify), None
  try:
    notify.wait('STATUS=waiting for camera server', 60)   # its publishers are up
    second = Daemon(daemon, tiny_artifacts, notify=notify2)
    notify2.wait('STATUS=waiting for camera server', 60)
    rc = first.proc.wait(10)
    assert second.proc.poll() is None
  finally:
    for d in (second, first):
      if d is not None: d.stop()
    notify.close(); notify2.close()
  err = first.stderr()
  assert rc == 1 and 'a newer publisher took the endpoint' in err and f'(another {daemon} on OPENPILOT_PREFIX' in err and 'Traceback' not in err, err

@pytest.mark.parametrize('daemon', DAEMONS)
def test_a_camera_without_the_daemons_streams_keeps_it_waiting_alive_and_stoppable(daemon, tiny_artifacts):
  """The camera server serves only the other daemon's streams. The daemon waits for its own, and meanwhile kicks the
  watchdog (systemd's WatchdogSec would kill it otherwise) and stops at once on SIGTERM."""
  other = next(streams for name, (_, _, streams) in DAEMONS.items() if name != daemon)
  cam = Camera(other)
  notify = Notify()
  d = Daemon(daemon, tiny_artifacts, notify=notify, env={'WATCHDOG_USEC': '200000'})   # a kick every 0.1 s
  try:
    notify.wait(r"STATUS=waiting for camera server 'camerad'", 90)   # the artifact is loaded
    for _ in range(10): notify.wait('WATCHDOG=1', 1)   # 10 kicks, none more than 1 s after the one before
  finally:
    rc, dt = d.stop()
    cam.close(); notify.close()
  assert rc == 0 and dt < 1, f"expected exit 0 within 1 s of SIGTERM, got {rc} after {dt:.2f} s"
  assert 'READY=1' not in notify.messages, "a daemon without its camera must not report ready"

@pytest.mark.parametrize('daemon,output,width', [('modeld', 'lead', 216), ('dmonitoringd', 'face_descs_lhd', 10)])
def test_outputs_that_cannot_be_parsed_skip_frames_then_exit_78(daemon, output, width):
  """An artifact whose `output` slice has the wrong width (its manifest edited: modeld-compile refuses such a model
  outright). Every frame is skipped (nothing
  published, counted), the daemon keeps going for MAX_BAD_OUTPUTS frames, then exits 78 naming the output, the width
  the parser expects and the one the model gives; never a traceback. (face_descs_lhd 10 wide would parse into garbage
  without an error: the size check catches what an exception would not.)"""
  cls, family, streams = DAEMONS[daemon]
  art = build(CACHE.parent / f'tiny-{output}-{width}', family=family, models='tiny', widths=((output, width),))
  cam = Camera(streams)
  d, notify = start_daemon(daemon, art)
  col = Collector(cls.PUBLISHES)
  try:
    for n in range(1, 10 * MAX_BAD_OUTPUTS):
      if d.proc.poll() is not None: break
      cam.send(n)
      time.sleep(0.05)   # the camera's pace; a frame it misses meanwhile is conflated away, not counted
    rc = d.proc.wait(30)
    notify.wait('STATUS=stopped', 5)   # the final totals
    col.poll()
  finally:
    d.stop()
    cam.close(); col.close(); notify.close()
  err = d.stderr()
  want = next(h.width for m in lookup(family, 'openpilot-0.11.1').models.values() for k, h in m.heads.items() if k == output)
  assert rc == EX_CONFIG, err
  assert f"OutputError: the outputs of {MAX_BAD_OUTPUTS} frames in a row could not be parsed, the last because output " \
         f"'{output}': expected {want} values, got {width}" in err
  assert notify.count('bad_output') == MAX_BAD_OUTPUTS and notify.count('frames') == 0
  assert all(m == [] for m in col.msgs.values()) and 'Traceback' not in err

def test_a_hidden_state_of_another_width_is_refused_with_the_artifact():
  """The road runner feeds hidden_state back to the policy itself, every frame: a model whose hidden_state is not the
  policy's feature width cannot run at all, so the loader refuses it (exit 78 in the daemon), before any camera."""
  from modelrt.artifact import ArtifactError, load_artifact
  art = build(CACHE.parent / 'tiny-hidden_state-500', family='road', models='tiny', widths=(('hidden_state', 500),))
  with pytest.raises(ArtifactError, match=r"vision output 'hidden_state': expected 512 values \(the policy's features\), got 500. Rebuild"):
    load_artifact(art, 'road')

@pytest.mark.parametrize('daemon', DAEMONS)
def test_malformed_messages_at_100hz_on_every_input_cost_no_output(daemon, tiny_artifacts):
  """Garbage, truncated messages and valid messages of the wrong type, 100 a second on every service the daemon
  subscribes to (camera states from the camera's own publishers), while the camera sends frames (60 at least, and until
  every input got 10 of each kind): every frame is answered."""
  cls, _, streams = DAEMONS[daemon]
  cam = Camera(streams)
  others = messaging.PubMaster([s for s in cls.SUBSCRIBES if s not in CAMERA_STATE_SERVICES.values()])
  socks = {**others.sock, **{s: cam.pm.sock[s] for s in cls.SUBSCRIBES if s in cam.pm.sock}}
  assert sorted(socks) == sorted(cls.SUBSCRIBES)
  d, notify = start_daemon(daemon, tiny_artifacts)
  col = Collector(cls.PUBLISHES)
  faults = MessageFaults(socks, hz=100)
  faults.start()
  try:
    n = 0
    while n < 60 or min(faults.counts.values()) < len(socks) * 10:   # 60 frames, and at least 10 faults of each kind on each input
      cam.send(n := n + 1)
      for s in cls.PUBLISHES:   # driverMonitoringState carries no frame id: one per frame is what counts
        last = col.wait(s, n)[-1]
        assert s == 'driverMonitoringState' or getattr(last, s).frameId == n
    counts = faults.stop()
    notify.wait_count('malformed', 1)   # garbage is dropped and counted (what conflation skips is neither)
  finally:
    faults.stop()
    rc, _ = d.stop()
    cam.close(); col.close(); notify.close(); others.close()
  assert rc == 0 and all(counts[k] >= len(socks) * 10 for k in MESSAGE_FAULTS), counts

def test_recorder_on_a_full_disk_stops_with_a_clear_error_and_readable_segments(tmp_path):
  """modeld-record on a 96 KiB tmpfs, 0.3 s segments, fed carState as fast as it goes: it exits 1 saying the disk is
  full and naming the segments it could not finish (not only the last: one closing as the disk filled too); every other
  segment reads back whole, and all of them byte-identical to what was sent up to where the disk filled."""
  mount, keep = tmp_path / 'disk', tmp_path / 'kept'
  mount.mkdir(); keep.mkdir()
  if not can_mount_tmpfs(str(tmp_path / 'probe')): pytest.skip("no user namespace to mount a size-limited tmpfs in")
  pm = messaging.PubMaster(['carState'])
  cmd = [sys.executable, '-m', 'modeld_tools.record', 'carState', '--route', str(mount / 'r'), '--segment-seconds', '0.3', '--flush-seconds', '0.1']
  p = subprocess.Popen(full_disk(cmd, 96 * 1024, str(mount), str(keep)), cwd=REPO, stderr=subprocess.PIPE, text=True)
  sent, rng = [], np.random.default_rng(0)
  try:
    deadline = time.monotonic() + 60
    while p.poll() is None and time.monotonic() < deadline:
      for _ in range(10):
        msg = messaging.new_message('carState')
        msg.carState.vEgo = float(rng.random())   # random: compressed, each message still takes some room
        sent.append(dat := msg.to_bytes())
        pm.send('carState', dat)
      time.sleep(0.001)
    rc, err = p.wait(10), p.stderr.read()
  finally:
    if p.poll() is None: p.kill()
    pm.close()
  assert rc == 1 and 'Traceback' not in err, err
  said = re.search(r"error modeld-record: \[Errno 28\] No space left on device.*: recording stopped; (?:(.*) unfinished \(each reads up to "
                   r"where the disk filled\), the other segments|every segment) complete", err)
  assert said, err
  segs = segment_dirs(keep / 'r')
  assert len(segs) >= 3, [s.name for s in segs]
  got, cut = [], []
  for seg in segs:   # the segments named unfinished read up to the damage, the others whole; in order, none missing between
    lr = LogReader(seg)
    got += [dat for dat, ev in lr.raw() if ev.which() == 'carState']
    if lr.warnings: cut.append(seg.name)
  named = said.group(1).split(', ') if said.group(1) else []
  assert set(cut) <= set(named) and segs[0].name not in named, (cut, err)
  assert got and got == sent[sent.index(got[0]):][:len(got)]
