"""MLflow "model from code" for a registered checkpoint: weights in safetensors, nothing pickled.

`mlflow.pyfunc.save_model(python_model=<this file>)` copies this file into the model folder
and runs it on load (`set_model` below names the model object), so the registry stores code
and a safetensors file — never a pickle, which loading would have to execute (seed §14).

This file is model code, not a library module: it must import nothing from Trainyard (a
registered model loads where Trainyard is not installed), and nothing should import it.

Serving is out of scope (seed §1); `predict` describes the weights: for a list of tensor names
(or an empty list, for all) it returns `name<TAB>dtype<TAB>[shape]` lines. Training code loads
the tensors themselves with `safetensors.torch.load_file(model.unwrap_python_model().path)`.
"""

from __future__ import annotations

from typing import Any

import mlflow.pyfunc
from mlflow.models import set_model


class SafetensorsWeights(mlflow.pyfunc.PythonModel):
    """Reads only the safetensors header on load; tensors stay on disk until someone asks."""

    path: str = ""
    tensors: dict[str, tuple[str, list[int]]] = {}  # noqa: RUF012 - replaced per instance on load

    def load_context(self, context: Any) -> None:
        from safetensors import safe_open

        self.path = context.artifacts["weights"]
        with safe_open(self.path, framework="numpy") as f:
            self.tensors = {k: (f.get_slice(k).get_dtype(), list(f.get_slice(k).get_shape()))
                            for k in f.keys()}  # noqa: SIM118 - safe_open has no __iter__

    def predict(self, model_input: list[str], params: dict[str, Any] | None = None) -> list[str]:
        names = list(model_input) or sorted(self.tensors)
        unknown = [n for n in names if n not in self.tensors]
        if unknown:
            raise ValueError(f"no tensor named {unknown[:5]} in {self.path}")
        return [f"{n}\t{self.tensors[n][0]}\t{self.tensors[n][1]}" for n in names]


set_model(SafetensorsWeights())
