"""Batched builds (modeld-compile --batch N) and segments side by side through them (modelrt/batch.py,
modeld-batch --batch-frames N): each row of a batch is the model on that frame alone, within matches_eager's tolerance."""
import json, os, subprocess, sys, threading
import numpy as np
import pytest
from tinygrad.helpers import Context
from tests.artifacts import CACHE, LAYOUT, REPO, build
from tests.openpilot_route import write_route
from modelrt.artifact import ArtifactError, load_artifact
from modelrt.batch import Batch, DMSlot, RoadSlot
from modelrt.compile import InputPlan, ValidationError, reloaded, build_jit, matches_eager
from modelrt.replay import TensorSpec
from modelrt.runner import DMRunner, HostBuf, RoadRunner

ENV = {**os.environ, "DEV": "CPU", "RAY_AUTH_MODE": "disabled"}
N = 2

@pytest.fixture(scope="module")
def arts():
  return build(CACHE.parent / "tiny-batch", layouts=(LAYOUT,), models="tiny", batches=(N,))

def test_a_batched_build_holds_each_model_on_n_frames(arts):
  """--batch N adds <model>_b<N> JITs whose inputs and output have N rows; the manifest and the rebuild command say so,
  and a batch the artifact lacks is refused naming the command that builds it."""
  for family, models in (("road", ("vision", "policy")), ("dm", ("dm",))):
    art = load_artifact(arts, family)
    assert art.batches == [1, N] and art.manifest["options"]["batches"] == [N] and art.manifest["command"][-2:] == ["--batch", str(N)]
    for k in models:
      b, one = art.load_batch(k, N), art.models[k]
      assert {n: s.shape for n, s in b.inputs.items()} == {n: (N, *s.shape[1:]) for n, s in one.inputs.items()}
      assert b.jit.captured.ret.shape == (N, *one.jit.captured.ret.shape[1:])
    with pytest.raises(ArtifactError, match=rf"no batch of 4 frames \(this artifact has 1, {N}\)\. Build it with: .*--batch {N} --batch 4$"):
      art.load_batch(models[0], 4)

def test_a_model_that_mixes_the_frames_of_a_batch_is_refused(tmp_path):
  """Each row of a batched build is checked against the model on that frame alone: a batch's rows must stay apart."""
  with Context(PARALLEL=0):
    plan = InputPlan("x", (1, 64), "float32", "device")
    entry = build_jit("m", lambda x: (x * 2).sum(1, keepdim=True).contiguous().realize(), [plan], "CPU", tmp_path)
    single = reloaded(tmp_path, "m", entry, [TensorSpec.from_json(s) for s in entry["inputs"]])
    mixed = lambda x: (x * 2 + x.mean(0)).sum(1, keepdim=True).contiguous().realize()
    with pytest.raises(ValidationError, match="m_b2: row 0 of a batch of 2 differs from the model run on that frame alone"):
      build_jit("m_b2", mixed, [InputPlan("x", (2, 64), "float32", "device")], "CPU", tmp_path, single=single)
    build_jit("m_b2", lambda x: (x * 2).sum(1, keepdim=True).contiguous().realize(), [InputPlan("x", (2, 64), "float32", "device")],
              "CPU", tmp_path, single=single)

def frames_of(session: int, n: int) -> list[np.ndarray]:
  rng = np.random.default_rng(session)
  return [rng.integers(0, 256, LAYOUT.size, dtype=np.uint8) for _ in range(n)]

def drive(road, dm, frames: list[np.ndarray]) -> list[np.ndarray]:
  """Each frame through both runners (a desire pulse at the third, a prepare-only fifth): outputs end to end."""
  outs, bufs = [], (HostBuf(LAYOUT), HostBuf(LAYOUT))
  for i, f in enumerate(frames):
    bufs[0].data[:], bufs[1].data[:] = f, f[::-1]
    o = road.run(bufs[0], bufs[0], np.eye(8)[2] if i == 2 else np.zeros(8), np.array([i % 2, 1 - i % 2]), prepare_only=i == 4)
    d = dm.run(bufs[1], np.array([0.01, 0.02 * i, 0.03]), np.eye(3))
    outs.append(np.concatenate([o.raw if o else [], d.raw]))
  return outs

def test_sessions_side_by_side_equal_each_run_alone(arts):
  """Three sessions of different lengths through a batch of 2 on threads of their own (the third takes the slot the
  first leaves, its history from a fresh start): every output within tolerance of the same session through the
  one-frame runners. A batch runs when every slot in use waits, so a session that ends never holds the others."""
  road, dm = load_artifact(arts, "road"), load_artifact(arts, "dm")
  lengths = (7, 4, 5)
  alone = [drive(RoadRunner(road, LAYOUT), DMRunner(dm, LAYOUT), frames_of(s, n)) for s, n in enumerate(lengths)]
  batch, got, errors = Batch({"road": road, "dm": dm}, N), {}, []
  def session(s: int) -> None:
    try:
      with batch.slot() as i: got[s] = drive(RoadSlot(batch, i, LAYOUT), DMSlot(batch, i, LAYOUT), frames_of(s, lengths[s]))
    except Exception as e: errors.append(e)
  threads = [threading.Thread(target=session, args=(s,)) for s in range(N)]
  for t in threads: t.start()
  threads[1].join(timeout=120)
  session(2)   # in the slot the second left, beside the first
  threads[0].join(timeout=120)
  assert not errors and sorted(got) == [0, 1, 2], errors
  for s in range(3):
    assert len(got[s]) == lengths[s] and all(matches_eager(g, a) for g, a in zip(got[s], alone[s])), s

def batch_job(*args) -> subprocess.CompletedProcess:
  return subprocess.run([sys.executable, "-m", "modeld_batch", *map(str, args), "--quiet"], cwd=REPO, capture_output=True, text=True, env=ENV,
                        timeout=300)

def outputs(out) -> dict:
  """Per segment and output service, every message's fields but the run's timings."""
  from oproute import LogReader
  got = {}
  for rlog in sorted(out.glob("*/*/rlog.zst")):
    for ev in LogReader(str(rlog)):
      if (w := ev.which()) in ("modelV2", "driverStateV2", "driverMonitoringState"):
        d = getattr(ev, w).to_dict()
        for k in ("modelExecutionTime", "gpuExecutionTime", "processingTime"): d.pop(k, None)
        got.setdefault((rlog.parent.name, w), []).append((ev.valid, d))
  return got

def close(a, b) -> bool:
  """Equal structure, numbers within matches_eager's tolerance."""
  if isinstance(a, dict): return isinstance(b, dict) and a.keys() == b.keys() and all(close(a[k], b[k]) for k in a)
  if isinstance(a, (list, tuple)): return isinstance(b, (list, tuple)) and len(a) == len(b) and all(map(close, a, b))
  if isinstance(a, float): return isinstance(b, float) and matches_eager(np.array([a]), np.array([b]))
  return a == b

def test_modeld_batch_runs_segments_side_by_side(arts, scene, tmp_path):
  """modeld-batch --batch-frames 2 on one worker: three segments of two routes (of other lengths, one with a frame the
  encoder dropped) give the messages of --batch-frames 1, numbers within tolerance; a batch the artifacts lack is
  refused before Ray starts, naming the build that adds it."""
  write_route(tmp_path / "r1", scene, segments=2, frames=6, missing={("road", 102)})
  write_route(tmp_path / "r2", scene, segments=1, frames=4, first_frame_id=300)
  runs = {n: batch_job(tmp_path / "r1", tmp_path / "r2", "--artifacts", arts, "--out", tmp_path / f"out{n}", "--workers", 1, "--batch-frames", n)
          for n in (1, N)}
  assert all(r.returncode == 0 for r in runs.values()), {n: r.stderr[-2000:] for n, r in runs.items()}
  one, two = outputs(tmp_path / "out1"), outputs(tmp_path / f"out{N}")
  assert one.keys() == two.keys() and len(one) == 9 and all(close(one[k], two[k]) for k in one), set(one) ^ set(two)
  summary = [json.loads((tmp_path / f"out{n}" / "summary.json").read_text())["routes"] for n in (1, N)]
  assert [[(r["frames"], r["done"], r["lost"]) for r in s] for s in summary] == [[(12, 2, 1), (4, 1, 0)]] * 2, summary
  r = batch_job(tmp_path / "r2", "--artifacts", arts, "--out", tmp_path / "out4", "--batch-frames", 4)
  assert r.returncode == 1 and f"--batch-frames 4: {arts}/road has batches of 1, {N} frames; build it with: " in r.stderr and \
    r.stderr.rstrip().endswith("--batch 4"), r.stderr
