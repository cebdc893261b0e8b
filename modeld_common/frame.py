"""One camera frame through a model, for both daemons' frame models (modeld/model.py, dmonitoringd/model.py): the
calibration in force, the checked run, the guarded parsing and filling, the counts. No socket: the daemons feed it
live frames, modeld-batch recorded ones. No model output, however wrong, crashes a daemon."""
from __future__ import annotations
import logging, time
from dataclasses import dataclass
from typing import Any
from collections.abc import Callable
import numpy as np
from service import Stats
from modelrt.calibration import Calibration

MAX_BAD_OUTPUTS = 20    # frames in a row whose outputs cannot be parsed before the daemon gives up (1 s at 20 Hz)

class OutputError(RuntimeError):
  """Frame after frame, the model's outputs could not be parsed: the artifact's model does not fit this daemon."""

class OutputGuard:
  """Parses and fills one frame's outputs. Their sizes are checked against the contract first (a wrong size may also
  parse without an error, into garbage). A frame that fails is skipped (nothing published), counted as `bad_output`
  and logged; MAX_BAD_OUTPUTS failures in a row raise OutputError, naming the output with its expected and actual size."""
  def __init__(self, sizes: dict[str, int], stats: Stats, log: logging.Logger, limit: int = MAX_BAD_OUTPUTS):
    self.sizes, self.stats, self.log, self.limit, self.failures = sizes, stats, log, limit, 0

  def mismatches(self, outs: dict[str, np.ndarray]) -> str:
    return '; '.join(f"output {k!r}: expected {n} values, got {outs[k].size if k in outs else 'none'}"
                     for k, n in self.sizes.items() if k not in outs or outs[k].size != n)

  def __call__(self, frame_id: int, outs: dict[str, np.ndarray], fn: Callable[..., Any], *args) -> Any:
    """fn(outs, *args), or None if the outputs cannot be parsed (the frame is skipped)."""
    if not (why := self.mismatches(outs)):
      try:
        result = fn(outs, *args)
        self.failures = 0
        return result
      except Exception as e:
        why = f"{type(e).__name__}: {e}"
        self.log.debug("frame %d: parsing or filling failed", frame_id, exc_info=True)
    self.failures += 1
    self.stats.count('bad_output')
    self.log.error("frame %d skipped, its outputs cannot be parsed (%d in a row): %s", frame_id, self.failures, why)
    if self.failures >= self.limit:
      raise OutputError(f"the outputs of {self.failures} frames in a row could not be parsed, the last because {why}. The artifact's "
                        "model does not produce the outputs this daemon parses: rebuild it from a model in openpilot's output layout "
                        "(modeld-compile --help)")
    return None

@dataclass
class FrameRun:
  """A model run of one frame: the camera frames it read, its outputs, when it started and how long it took, and whether
  the camera reused a buffer meanwhile (torn)."""
  frames: tuple
  out: Any          # modelrt.runner.ModelOutput
  t0: float
  run_time: float
  torn: bool

class FrameModel:
  """What both frame models keep (the runner, the message state, the calibration, the guard) and the steps of a frame
  they share; each model's `step` calls them in order."""
  def __init__(self, runner, sm, stats: Stats, log: logging.Logger, raw_predictions: bool = False, sensor: str | None = None):
    self.runner, self.sm, self.stats, self.log, self.raw_predictions, self.sensor = runner, sm, stats, log, raw_predictions, sensor
    self.contract = runner.artifact.contract
    self.guard = OutputGuard({k: h.width for m in self.contract.models.values() for k, h in m.heads.items()}, stats, log)
    self.calib, self._calib_t = Calibration(), None

  def reset(self) -> None:
    """A new camera session: no history from another."""
    self.runner.reset()

  def update_calibration(self) -> None:
    """A new liveCalibration applies from this frame on; a bad one is counted (and makes the outputs invalid)."""
    if (t := self.sm.logMonoTime['liveCalibration']) != self._calib_t:
      self._calib_t = t
      if self.sm.seen['liveCalibration']:
        self.calib.update(self.sm['liveCalibration'].rpyCalib)
        if not self.calib.valid: self.stats.count('bad_calibration')

  def run(self, frames: tuple, **inputs) -> FrameRun | None:
    """The runner on these frames' inputs: a FrameRun with outputs, or None (counted) where the inputs fail their check
    or the frame only feeds the history."""
    from modelrt.replay import InputSpecError   # not at the top: it imports tinygrad, which reads DEV once, after the options set it
    fid, t0 = frames[0].frame_id, time.perf_counter()
    try: out = self.runner.run(**inputs)
    except InputSpecError as e:
      self.stats.count('bad_input')
      self.log.error("frame %d skipped: %s", fid, e)
      return None
    run = FrameRun(frames, out, t0, time.perf_counter() - t0, any(f.overwritten() for f in frames))   # after the run: False means untorn
    if run.torn:
      self.stats.count('torn')
      self.log.debug("frame %d torn: the camera reused its buffer during the run", fid)
    if out is None:
      self.stats.count('prepare_only')
      return None
    if not out.finite:
      self.stats.count('nonfinite')
      self.log.debug("frame %d: non-finite model outputs, published invalid", fid)
    return run

  def messages(self, run: FrameRun, fill: Callable[[dict, FrameRun, bool], list], valid: bool) -> list:
    """fill(outputs, run, valid) under the guard: [(service, message)], or [] for a frame whose outputs cannot be parsed."""
    if (msgs := self.guard(run.frames[0].frame_id, run.out.outputs, fill, run, valid)) is None: return []
    self.stats.count('frames')
    self.stats.timing('exec', run.run_time)
    self.stats.timing('frame', time.perf_counter() - run.t0)   # frame in hand -> messages made: the run and the daemon's own work
    if not all(m.valid for _, m in msgs): self.stats.count('invalid')   # as published: fill may find more wrong
    return msgs
