"""The models on a tinygrad device that is not the host CPU, as on a GPU: CPU:1, a second CPU device, runs here on any
machine. Its buffers are no host memory to the runtime: camera frames are copied in by the warps, outputs copied out,
and replays go through tinygrad's own path, the input checks before them as on the CPU."""
import subprocess, sys
import numpy as np
import pytest
from msgq.visionipc import DRIVER, ROAD, WIDE_ROAD
from tests.artifacts import LAYOUT, REPO
from tests.daemon_harness import Camera, Collector, Daemon, start_daemon
from modeld_common.daemon import EX_CONFIG
from modelrt.artifact import load_artifact
from modelrt.constants import DESIRE_LEN
from modelrt.replay import InputSpecError, _Launch
from modelrt.runner import DMRunner, HostBuf, RoadRunner, host_tensor

def frames(road: RoadRunner, dm: DMRunner, images: list[HostBuf]) -> list[np.ndarray]:
  road.set_transforms(np.eye(3), np.eye(3))
  out = []
  for i, b in enumerate(images):
    out.append(road.run(b, b, np.eye(DESIRE_LEN)[i % DESIRE_LEN], np.array([1., 0])).raw)
    out.append(dm.run(b, np.zeros(3, np.float32), np.eye(3, dtype=np.float32)).raw)
  return out

def test_a_second_device_runs_the_models_bit_identical_to_the_cpu(tiny_artifacts, device_artifacts):
  """The same build for CPU:1: every kernel replayed by tinygrad (none bound by the CPU replay), outputs equal to the
  CPU's bit for bit over frames that fill the history; a host input or a camera buffer of another length is refused by
  name before anything runs."""
  rng = np.random.default_rng(0)
  images = [HostBuf(LAYOUT, rng.integers(0, 256, LAYOUT.size, dtype=np.uint8)) for _ in range(6)]
  arts = {dev: {f: load_artifact(path, f, dev) for f in ('road', 'dm')} for dev, path in (('CPU', tiny_artifacts), ('CPU:1', device_artifacts))}
  assert arts['CPU:1']['road'].manifest['target']['device'] == 'CPU:1'
  runners = {dev: (RoadRunner(a['road'], LAYOUT, LAYOUT), DMRunner(a['dm'], LAYOUT)) for dev, a in arts.items()}
  got = {dev: frames(*r, images) for dev, r in runners.items()}
  assert all(np.array_equal(a, b) for a, b in zip(got['CPU'], got['CPU:1'], strict=True))
  vision = arts['CPU:1']['road'].models['vision']
  assert vision.steps and not any(isinstance(s, _Launch) for s in vision.steps)   # tinygrad's path, as on a GPU
  assert any(isinstance(s, _Launch) for s in arts['CPU']['road'].models['vision'].steps)
  road, _ = runners['CPU:1']
  with pytest.raises(ValueError, match=r"desire: expected shape \(8,\), got \(9,\)"): road.run(images[0], images[0], np.zeros(9), np.zeros(2))
  short = HostBuf(type(LAYOUT)(LAYOUT.width, LAYOUT.height, LAYOUT.stride, LAYOUT.uv_offset, LAYOUT.size + 64))
  with pytest.raises(InputSpecError, match="expected layout"): road.run(short, images[0], np.zeros(DESIRE_LEN), np.zeros(2))
  policy = arts['CPU:1']['road'].models['policy']
  specs = policy.inputs
  feed = {k: host_tensor(np.zeros(s.shape, s.dtype)) for k, s in specs.items()}
  k = next(iter(feed))   # a 1-D length change: the JIT's own check would let it through
  feed[k] = host_tensor(np.zeros(int(np.prod(specs[k].shape)) + 1, specs[k].dtype))
  with pytest.raises(InputSpecError, match=f"input '{k}': expected shape"): policy.run(feed)

def test_the_daemons_serve_frames_on_a_second_device(device_artifacts):
  """modeld and dmonitoringd with --device CPU:1 answer every frame; the same artifact on the CPU is refused (78),
  naming both devices and the command that builds for it."""
  cam = Camera({ROAD: LAYOUT, WIDE_ROAD: LAYOUT, DRIVER: LAYOUT})
  (d, dn), (m, mn) = (start_daemon(n, device_artifacts, '--device', 'CPU:1') for n in ('dmonitoringd', 'modeld'))
  col = Collector(['modelV2', 'driverStateV2'])
  try:
    for n in range(1, 6):
      cam.send(n)
      assert col.wait('modelV2', n)[-1].modelV2.frameId == n and col.wait('driverStateV2', n)[-1].driverStateV2.frameId == n
  finally:
    rcs = [x.stop()[0] for x in (d, m)]
    cam.close(); col.close(); dn.close(); mn.close()
  assert rcs == [0, 0], d.stderr() + m.stderr()
  bad = Daemon('modeld', device_artifacts, '--device', 'CPU')
  try: rc = bad.proc.wait(60)
  finally: bad.stop()
  assert rc == EX_CONFIG and "built for device CPU:1, this process uses CPU" in bad.stderr(), bad.stderr()

def test_the_shape_schedule_is_refused_where_it_does_not_apply(tmp_path):
  """modeld-compile: the shape schedule writes clang CPU kernels, so a device that compiles otherwise (here tinygrad's
  Python emulator) gets it refused by name (its default there is tinygrad's); a device that cannot be opened is named."""
  def compile_(*args):
    return subprocess.run([sys.executable, '-m', 'modelrt.compile', '--reference', '--out', tmp_path, '--camera', str(LAYOUT), *args],
                          capture_output=True, text=True, cwd=REPO, timeout=120)
  r = compile_('--device', 'PYTHON', '--schedule', 'shape')
  assert r.returncode == 2 and "--schedule shape: schedule 'shape' writes clang CPU kernels, PYTHON compiles with PythonRenderer" in r.stderr, r.stderr
  r = compile_('--device', 'NOPE')
  assert r.returncode == 1 and "tinygrad device 'NOPE' cannot be opened on this machine" in r.stderr, r.stderr
  assert not any(tmp_path.iterdir())
