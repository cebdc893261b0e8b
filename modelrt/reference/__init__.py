"""Built-in reference models in tinygrad code, in openpilot's model I/O layout (see docs/REFERENCE_MODELS.md).

`modeld-compile --reference` compiles these exactly like ONNX models: each is a ModelDef.
"""
from modelrt.reference.road import vision_model, policy_model
from modelrt.reference.dm import dm_model

__all__ = ['vision_model', 'policy_model', 'dm_model']
