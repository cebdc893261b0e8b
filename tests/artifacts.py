"""Model artifacts for daemon tests and benchmarks, built once into .cache/artifacts (git-ignored) with modeld-compile.

The build is content-addressed (sources, options, layouts, tinygrad, target): a re-run with nothing changed only
verifies and returns. Tiny camera layouts keep the buffers small; the warps' cost does not depend on them.
"""
import functools, json, os, pathlib, subprocess, sys
from msgq.visionipc.layout import NV12Layout

REPO = pathlib.Path(__file__).resolve().parents[1]
CACHE = REPO / '.cache' / 'artifacts'
LAYOUT = NV12Layout.packed(64, 48)           # road, wide road and driver streams of the tests
ALT_LAYOUT = NV12Layout.aligned(64, 48)      # a second layout the road artifact serves (camera restart with new buffers)
UNSERVED_LAYOUT = NV12Layout.packed(96, 64)  # a layout no artifact serves

@functools.cache   # once per process: test files that share a build check it once
def build(out: pathlib.Path = CACHE, layouts: tuple[NV12Layout, ...] = (LAYOUT, ALT_LAYOUT), family: str | None = None,
          models: str = 'reference', widths: tuple[tuple[str, int], ...] = (), device: str | None = None, batches: tuple[int, ...] = ()) -> pathlib.Path:
  """modeld-compile for the given layouts (both families unless one is named); returns the artifact dir.
  models: 'reference' (the built-in models) or 'tiny' (the tiny ONNX models of tests/onnx_models.py: seconds to build).
  widths: (output, width) pairs whose slice in the built artifact's manifest gets that width instead of the contract's,
  from the same start: an artifact whose outputs the daemons cannot parse (modeld-compile refuses such a model, so the
  manifest, which its file hashes do not cover, is edited after the build). device: modeld-compile's --device; batches: its --batch."""
  if models == 'tiny':
    from tests.onnx_models import vision_onnx, policy_onnx, dm_onnx
    (src := out / 'onnx').mkdir(parents=True, exist_ok=True)
    srcs = ['--vision-onnx', str(vision_onnx(src / 'vision.onnx')), '--policy-onnx', str(policy_onnx(src / 'policy.onnx')),
            '--dm-onnx', str(dm_onnx(src / 'dm.onnx'))]
  else: srcs = ['--reference']
  cmd = [sys.executable, '-m', 'modelrt.compile', *srcs, '--quiet', '--out', str(out), *[a for l in layouts for a in ('--camera', str(l))]]
  if family: cmd += ['--family', family]
  if device: cmd += ['--device', device]
  cmd += [a for n in batches for a in ('--batch', str(n))]
  env = {**os.environ, 'DEV': os.environ.get('DEV', 'CPU'), 'PARALLEL': '0'}
  r = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO)
  if r.returncode != 0: raise RuntimeError(f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stdout}\n{r.stderr}")
  for fam in ('road', 'dm') if widths else ():
    if not (m := out / fam / 'manifest.json').exists(): continue
    manifest = json.loads(m.read_text())
    for slices in manifest['output_slices'].values():
      for k, w in widths:
        if k in slices: slices[k] = [slices[k][0], slices[k][0] + w]
    m.write_text(json.dumps(manifest, indent=1))
  return out
