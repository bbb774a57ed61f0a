"""Reading ONNX models for the ``kiln`` subcommands.

Owns: opening an ``.onnx`` file with one-line errors, and importing it into Kiln IR with the
``--input-shape`` overrides checked against the model's inputs. ``onnx`` and the frontend are
imported inside the functions: importing this module costs nothing on a deploy-only machine.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from ..runtime.errors import FormatError, InputError, KilnError
from .args import require_file

__all__ = ["load_onnx_model", "import_onnx"]


def load_onnx_model(path: str) -> Any:
    """The ``onnx.ModelProto`` of ``path``.

    Raises
    ------
    KilnFileNotFoundError
        If the file does not exist.
    FormatError
        If protobuf cannot parse it as an ONNX model.
    """
    require_file(path, "ONNX model")
    try:
        import onnx
    except ImportError as err:  # pragma: no cover - onnx is a core dependency
        raise KilnError(f"reading ONNX models needs the 'onnx' package ({err})") from None
    try:
        return onnx.load(path)
    except Exception as err:  # noqa: BLE001 - protobuf raises assorted types
        raise FormatError(f"{path}: not a readable ONNX model ({type(err).__name__}: {err})") from None


def import_onnx(path_or_model: Any, shapes: Mapping[str, Sequence[int]] | None = None) -> tuple[Any, dict[str, Any]]:
    """``kiln.frontend.from_onnx`` with ``--input-shape`` overrides; returns ``(graph, params)``.

    Raises
    ------
    InputError
        If ``shapes`` names an input the model does not have (initializers do not count).
    """
    from .. import frontend

    model = load_onnx_model(path_or_model) if isinstance(path_or_model, str) else path_or_model
    if shapes:
        inits = {t.name for t in model.graph.initializer}
        names = [vi.name for vi in model.graph.input if vi.name not in inits]
        unknown = sorted(set(shapes) - set(names))
        if unknown:
            raise InputError(f"--input-shape names unknown input(s) {unknown}; the model's inputs: {names}")
    return frontend.from_onnx(model, shape=dict(shapes) if shapes else None)
