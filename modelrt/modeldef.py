"""One model, however it was defined (ONNX file or tinygrad code): what the compiler and runtime need to know."""
from dataclasses import dataclass
from typing import Callable
from tinygrad import Tensor

@dataclass(frozen=True)
class ModelDef:
  name: str                                            # 'vision' | 'policy' | 'dm'
  inputs: dict[str, tuple[tuple[int, ...], str]]       # input name -> (shape, numpy dtype name), in call order
  output_slices: dict[str, slice]                      # cuts of the one flat float32 output vector
  fn: Callable[..., Tensor]                            # fn(**inputs) -> (1, N) float32 Tensor
  source_sha256: str                                   # hash of the ONNX file or of the defining source code
