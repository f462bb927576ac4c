"""JSON for small training state (RNG states, LR scheduler, sampler): no pickles, ever.

`state_dict()`s of schedulers and samplers hold ints, floats, lists, tuples, dicts with int
keys and sometimes tensors or numpy arrays; plain JSON loses tuples, non-string keys and
arrays. This codec tags exactly those (`{"__tuple__": …}`, `{"__dict__": [[k, v], …]}`,
`{"__tensor__": …}`, `{"__ndarray__": …}`, `{"__bytes__": …}`) and refuses anything else, so
what comes back is what went in and reading it can never run code. torch and numpy are only
imported when a tensor or array is actually met.
"""

from __future__ import annotations

import base64
import json
from typing import Any


def encode(value: Any, path: str = "$") -> Any:
    """A JSON-serialisable form of `value` (see the module docstring)."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, list):
        return [encode(v, f"{path}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, tuple):
        return {"__tuple__": [encode(v, f"{path}[{i}]") for i, v in enumerate(value)]}
    if isinstance(value, dict):
        plain = all(isinstance(k, str) and not (k.startswith("__") and k.endswith("__"))
                    for k in value)
        if plain:
            return {k: encode(v, f"{path}.{k}") for k, v in value.items()}
        return {"__dict__": [[encode(k, f"{path}<key>"), encode(v, f"{path}[{k!r}]")]
                             for k, v in value.items()]}
    if isinstance(value, bytes | bytearray):
        return {"__bytes__": base64.b64encode(bytes(value)).decode()}
    kind = type(value).__module__.split(".")[0]
    if kind == "torch":
        return _encode_tensor(value, path)
    if kind == "numpy":
        return _encode_numpy(value, path)
    raise TypeError(f"{path}: cannot store {type(value).__name__} in checkpoint JSON state; "
                    "state_dict() values must be numbers, strings, lists, tuples, dicts, "
                    "tensors or numpy arrays")


def decode(value: Any) -> Any:
    if isinstance(value, list):
        return [decode(v) for v in value]
    if isinstance(value, dict):
        if len(value) == 1:
            (tag, body), = value.items()
            if tag == "__tuple__":
                return tuple(decode(v) for v in body)
            if tag == "__dict__":
                return {_hashable(decode(k)): decode(v) for k, v in body}
            if tag == "__bytes__":
                return base64.b64decode(body)
            if tag == "__tensor__":
                return _decode_tensor(body)
            if tag == "__ndarray__":
                return _decode_numpy(body)
        return {k: decode(v) for k, v in value.items()}
    return value


def dumps(value: Any) -> bytes:
    return json.dumps(encode(value), separators=(",", ":")).encode()


def loads(data: bytes) -> Any:
    return decode(json.loads(data))


def _hashable(key: Any) -> Any:
    return tuple(_hashable(k) for k in key) if isinstance(key, list) else key


def _encode_tensor(value: Any, path: str) -> Any:
    import torch

    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{path}: cannot store {type(value).__name__} in checkpoint JSON state")
    t = value.detach().to("cpu").contiguous()
    raw = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
    return {"__tensor__": {"dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape),
                           "data": base64.b64encode(raw).decode()}}


def _decode_tensor(body: dict[str, Any]) -> Any:
    import torch

    dtype = _torch_dtype(body["dtype"])
    raw = bytearray(base64.b64decode(body["data"]))
    if not raw:
        return torch.empty(body["shape"], dtype=dtype)
    return torch.frombuffer(raw, dtype=torch.uint8).view(dtype).reshape(body["shape"]).clone()


def _torch_dtype(name: str) -> Any:
    import torch

    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown torch dtype {name!r} in checkpoint JSON state")
    return dtype


def _encode_numpy(value: Any, path: str) -> Any:
    import numpy as np

    if isinstance(value, np.generic):
        return value.item()
    if not isinstance(value, np.ndarray) or value.dtype.hasobject:
        raise TypeError(f"{path}: cannot store numpy {type(value).__name__} of objects")
    arr = np.ascontiguousarray(value)
    return {"__ndarray__": {"dtype": arr.dtype.str, "shape": list(arr.shape),
                            "data": base64.b64encode(arr.tobytes()).decode()}}


def _decode_numpy(body: dict[str, Any]) -> Any:
    import numpy as np

    dtype = np.dtype(body["dtype"])
    if dtype.hasobject:
        raise ValueError("object arrays are not allowed in checkpoint JSON state")
    return np.frombuffer(base64.b64decode(body["data"]), dtype=dtype).reshape(body["shape"]).copy()

