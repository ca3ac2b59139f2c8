"""Runs a numpy function on Keras backend tensors, eagerly or inside a compiled graph.

The collectives in ``kolo.keras._arrays`` work on numpy arrays. This module moves tensors of
the active Keras backend there and back:

- TensorFlow, eager: ``tensor.numpy()`` and back with ``tf.convert_to_tensor``.
- TensorFlow inside ``tf.function`` (``model.fit`` compiles its train step by default): one
  ``tf.numpy_function`` node, marked stateful so TensorFlow runs it once per step, in program
  order with the other collectives of the graph. No custom op is compiled against TensorFlow,
  so one kolo wheel works with every TensorFlow version. XLA (``jit_compile=True``) cannot call
  back into Python and is refused with a clear error.
- torch (and other eager backends): ``keras.ops.convert_to_numpy`` and back with
  ``keras.ops.convert_to_tensor`` (CPU tensors are viewed without a copy).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Optional

import keras
import numpy as np

from kolo.exceptions import ConfigError

ArrayFn = Callable[[list[np.ndarray]], list[np.ndarray]]


def backend() -> str:
    """The name of the active Keras backend (``"tensorflow"``, ``"torch"``, ``"jax"``, ...)."""
    return str(keras.backend.backend())


def _tf() -> Any:
    import tensorflow as tf

    return tf


def in_tf_graph() -> bool:
    """True while TensorFlow traces a graph (inside ``tf.function``) with the TF backend."""
    return backend() == "tensorflow" and not _tf().executing_eagerly()


_KERAS_XLA_HINT = (
    "compile the model with model.compile(..., jit_compile=False) (Keras turns XLA on by "
    "default when a GPU is visible)"
)


def _refuse_xla(hint: str = _KERAS_XLA_HINT) -> None:
    from tensorflow.python.framework import ops as tf_ops
    from tensorflow.python.ops import control_flow_util

    if control_flow_util.GraphOrParentsInXlaContext(tf_ops.get_default_graph()):
        raise ConfigError(f"kolo collectives cannot run inside an XLA-compiled function: {hint}")


def _refuse_tracer(values: Sequence[Any]) -> None:
    for value in values:
        if type(value).__module__.startswith("jax") and "Tracer" in type(value).__name__:
            raise ConfigError(
                "kolo.keras collectives cannot run inside a jax.jit-compiled function; use the "
                "tensorflow or torch Keras backend, or model.compile(..., run_eagerly=True)"
            )


def to_numpy(value: Any) -> np.ndarray:
    """``value`` (a backend tensor, variable, numpy array or Python number) as numpy."""
    if isinstance(value, np.ndarray):
        return value
    if hasattr(value, "value") and isinstance(value, keras.Variable):
        value = value.value
    if backend() == "tensorflow":
        tf = _tf()
        if isinstance(value, tf.IndexedSlices):
            value = tf.convert_to_tensor(value)
    return np.asarray(keras.ops.convert_to_numpy(value))


def to_tensor(array: np.ndarray, like: Optional[Any] = None) -> Any:
    """``array`` as a tensor of the active backend (on ``like``'s device under torch)."""
    if backend() == "torch" and like is not None and hasattr(like, "device"):
        import torch

        if not (array.flags.c_contiguous and array.flags.writeable):
            # (np.ascontiguousarray would turn a 0-d array into shape (1,).) An engine output
            # viewed read-only gets its own copy: torch wants writable memory.
            array = array.copy(order="C")
        return torch.from_numpy(array).to(like.device)
    return keras.ops.convert_to_tensor(array)


def call(
    fn: ArrayFn,
    values: Sequence[Any],
    out_shapes: Optional[Sequence[Optional[Sequence[Optional[int]]]]] = None,
    out_dtypes: Optional[Sequence[Any]] = None,
    name: str = "kolo_collective",
) -> list[Any]:
    """Applies ``fn`` (numpy arrays in, numpy arrays out) to backend tensors ``values``.

    ``out_shapes`` / ``out_dtypes`` describe the outputs (default: those of the inputs; a
    ``None`` dimension is unknown until run time, e.g. an allgather's first one).

    Example::

        doubled = _bridge.call(lambda xs: [x * 2 for x in xs], [keras.ops.ones(3)])
    """
    values = list(values)
    if backend() == "tensorflow":
        return call_tf(fn, values, out_shapes, out_dtypes, name)
    _refuse_tracer(values)
    outs = fn([to_numpy(v) for v in values])
    return [to_tensor(o, like=v) for o, v in zip(outs, values)]


def call_tf(
    fn: ArrayFn,
    values: Sequence[Any],
    out_shapes: Optional[Sequence[Optional[Sequence[Optional[int]]]]] = None,
    out_dtypes: Optional[Sequence[Any]] = None,
    name: str = "kolo_collective",
    xla_hint: str = _KERAS_XLA_HINT,
) -> list[Any]:
    """:func:`call` for TensorFlow tensors whatever the Keras backend (``kolo.tensorflow``):
    eagerly through ``.numpy()``, inside ``tf.function`` as one stateful
    ``tf.numpy_function`` node. ``xla_hint`` says how to turn XLA off in the error raised
    inside an XLA-compiled function.

    Example::

        doubled = _bridge.call_tf(lambda xs: [x * 2 for x in xs], [tf.ones(3)])
    """
    tf = _tf()
    tensors = [
        tf.convert_to_tensor(v.value if isinstance(v, keras.Variable) else v) for v in values
    ]
    dtypes = list(out_dtypes) if out_dtypes is not None else [t.dtype for t in tensors]
    if tf.executing_eagerly():
        outs = fn([t.numpy() for t in tensors])
        return [tf.convert_to_tensor(o, dtype=d) for o, d in zip(outs, dtypes)]
    _refuse_xla(xla_hint)
    shapes = list(out_shapes) if out_shapes is not None else [t.shape for t in tensors]

    def run(*arrays: np.ndarray) -> list[np.ndarray]:
        return [
            np.asarray(o, dtype=tf.as_dtype(d).as_numpy_dtype)
            for o, d in zip(fn(list(arrays)), dtypes)
        ]

    outs = tf.numpy_function(run, tensors, Tout=dtypes, stateful=True, name=name)
    for out, shape in zip(outs, shapes):
        out.set_shape(shape)
    return list(outs)
