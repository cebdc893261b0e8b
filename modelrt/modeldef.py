"""One model, however it was defined (ONNX file or tinygrad code): what the compiler and runtime need to know."""
from __future__ import annotations
import dataclasses
from dataclasses import dataclass
from collections.abc import Callable
from tinygrad import Tensor
from modelrt.contracts import Model

@dataclass(frozen=True)
class ModelDef:
  name: str                                            # 'vision' | 'policy' | 'dm'
  inputs: dict[str, tuple[tuple[int, ...], str]]       # input name -> (shape, numpy dtype name), in call order
  output_slices: dict[str, slice]                      # cuts of the one flat float32 output vector
  width: int                                           # the output vector's length
  fn: Callable[..., Tensor]                            # fn(**inputs) -> (1, width) float32 Tensor
  source_sha256: str                                   # hash of the ONNX file or of the defining source code
  batch_fn: Callable[[int], Callable[..., Tensor]] | None = None   # n -> the model's own graph on n frames (batched)

  @classmethod
  def to_contract(cls, name: str, model: Model, fn: Callable[..., Tensor], source_sha256: str) -> ModelDef:
    """A model written to a contract's model: its inputs, its heads back to back, the release's output width (with
    no width given, just the heads)."""
    return cls(name, {k: (i.shape, i.dtype) for k, i in model.inputs.items()}, model.slices(), model.built_width, fn, source_sha256)

  def fed(self, dtypes: dict[str, str]) -> ModelDef:
    """This model fed inputs of these dtypes (in this order): an input the graph declares otherwise is cast to the
    graph's dtype inside the program."""
    graph = self.inputs
    def cast(inputs: dict[str, Tensor]) -> dict[str, Tensor]: return {k: v.cast(graph[k][1]) if graph[k][1] != dtypes[k] else v for k, v in inputs.items()}
    def batch_fn(n: int) -> Callable[..., Tensor]: return lambda **inputs: self.batch_fn(n)(**cast(inputs))
    return dataclasses.replace(self, inputs={k: (graph[k][0], dt) for k, dt in dtypes.items()}, fn=lambda **inputs: self.fn(**cast(inputs)),
                               batch_fn=batch_fn if self.batch_fn else None)

  def batched(self, n: int) -> ModelDef:
    """This model on n frames at once: each input and the output with n rows where the model has one, row i of the
    output that of row i of the inputs. The model's own graph on n frames where it has one (an ONNX model: every layer
    one kernel over the n frames, each weight read once for them), else each frame through fn in turn, in one program."""
    if any(shape[0] != 1 for shape, _ in self.inputs.values()): raise ValueError(f"{self.name}: a batch needs inputs of one row, got {self.inputs}")
    def each(**inputs: Tensor) -> Tensor: return Tensor.cat(*[self.fn(**{k: v[i:i + 1] for k, v in inputs.items()}) for i in range(n)])
    return dataclasses.replace(self, inputs={k: ((n, *shape[1:]), dt) for k, (shape, dt) in self.inputs.items()},
                               fn=self.batch_fn(n) if self.batch_fn else each, batch_fn=None)
