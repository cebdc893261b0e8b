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

  @classmethod
  def to_contract(cls, name: str, model: Model, fn: Callable[..., Tensor], source_sha256: str) -> ModelDef:
    """A model written to a contract's model: its inputs, its heads back to back, the release's output width (with
    no width given, just the heads)."""
    return cls(name, {k: (i.shape, i.dtype) for k, i in model.inputs.items()}, model.slices(), model.built_width, fn, source_sha256)

  def fed(self, dtypes: dict[str, str]) -> ModelDef:
    """This model fed inputs of these dtypes (in this order): an input the graph declares otherwise is cast to the
    graph's dtype inside the program."""
    graph = self.inputs
    def fn(**inputs: Tensor) -> Tensor: return self.fn(**{k: v.cast(graph[k][1]) if graph[k][1] != dtypes[k] else v for k, v in inputs.items()})
    return dataclasses.replace(self, inputs={k: (graph[k][0], dt) for k, dt in dtypes.items()}, fn=fn)
