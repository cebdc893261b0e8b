"""Parsing openpilot model outputs: the primitives (safe_exp, sigmoid, softmax, mixture density heads) and every head
of a contract's model parsed by its kind, shared by both daemons' parsers.

Pure numpy, no NaN from finite inputs: exponentials are clamped or taken of non-positive numbers only.
"""
import numpy as np
from modelrt.contracts import Model

def safe_exp(x: np.ndarray) -> np.ndarray:
  """exp(min(x, 11)): a std from a log-std the model may have pushed far out."""
  return np.exp(np.minimum(x, 11.0))

def sigmoid(x: np.ndarray) -> np.ndarray:
  """openpilot's 1 / (1 + safe_exp(-x)): never below 1 / (1 + e^11) ~ 1.67e-5 (the clamp also keeps exp from overflowing)."""
  return (1.0 / (1.0 + safe_exp(-np.asarray(x)))).astype(np.float32)

def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
  e = np.exp(x - np.max(x, axis=axis, keepdims=True))
  return e / np.sum(e, axis=axis, keepdims=True)

def parse_binary_crossentropy(raw: np.ndarray) -> np.ndarray:
  return sigmoid(raw)

def parse_categorical_crossentropy(raw: np.ndarray, out_shape: tuple[int, ...]) -> np.ndarray:
  """(B, prod(out_shape)) logits -> (B, *out_shape) probabilities over the last axis."""
  return softmax(raw.reshape(raw.shape[0], *out_shape), axis=-1)

def parse_mdn(raw: np.ndarray, out_shape: tuple[int, ...], in_N: int = 0, out_N: int = 0) -> tuple[np.ndarray, np.ndarray]:
  """Mixture density head -> (mean, std).

  raw (B, D) is reshaped to (B, max(in_N, 1), -1); each row holds n means, n log-stds and out_N selection logits.
  With in_N > 1 hypotheses, each of the out_N selections softmaxes its logit over the hypotheses and takes the
  most likely one: mean/std come back as (B, out_N, *out_shape) (or (B, *out_shape) for out_N == 1).
  Without hypotheses they are (B, *out_shape).
  """
  B = raw.shape[0]
  r = raw.reshape(B, max(in_N, 1), -1)
  n = (r.shape[2] - out_N) // 2
  mu, std = r[:, :, :n], safe_exp(r[:, :, n:2 * n])
  if in_N > 1:
    weights = softmax(r[:, :, 2 * n:2 * n + out_N], axis=1)   # (B, in_N, out_N): per selection, over hypotheses
    best = np.argmax(weights, axis=1)                          # (B, out_N)
    b = np.arange(B)[:, None]
    mu, std = mu[b, best], std[b, best]                        # (B, out_N, n)
    shape = (B, *out_shape) if out_N == 1 else (B, out_N, *out_shape)
  else:
    shape = (B, *out_shape)
  return mu.reshape(shape), std.reshape(shape)

def parse_heads(outs: dict[str, np.ndarray], model: Model) -> dict[str, np.ndarray]:
  """outs {name: (1, width)} -> each head of the contract's model by its kind, batch axis dropped: an MDN head gives
  NAME (means) and NAME_std, sigmoid and softmax heads probabilities in the head's shape, a raw head its values."""
  out = {}
  for k, h in model.heads.items():
    raw = outs[k]
    if h.kind == 'mdn':
      mu, std = parse_mdn(raw, h.shape, h.in_N, h.out_N)
      out[k], out[k + '_std'] = mu[0], std[0]
    elif h.kind == 'sigmoid': out[k] = parse_binary_crossentropy(raw[0]).reshape(h.shape)
    elif h.kind == 'softmax': out[k] = parse_categorical_crossentropy(raw, h.shape)[0]
    else: out[k] = raw[0]
  return out
