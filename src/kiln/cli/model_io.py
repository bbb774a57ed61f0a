"""Reading models for the ``kiln`` subcommands: ONNX (``.onnx``) and ``torch.export`` (``.pt2``).

Owns: opening an ``.onnx`` file with one-line errors, and importing it into Kiln IR with the
``--input-shape`` overrides checked against the model's inputs; the same for a
``torch.export.save`` archive (``.pt2``, dispatched on the extension), whose shapes come from
the program itself. ``onnx``, ``torch`` and the frontend are imported inside the functions:
importing this module costs nothing on a deploy-only machine.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from ..runtime.errors import FormatError, InputError, KilnError
from .args import require_file

__all__ = ["load_onnx_model", "import_onnx", "is_pt2", "load_pt2", "import_pt2"]

#: File extension of ``torch.export.save`` archives.
PT2_SUFFIX = ".pt2"


def is_pt2(path: Any) -> bool:
    """Whether ``path`` names a ``torch.export`` archive (by its ``.pt2`` extension)."""
    return isinstance(path, str) and path.lower().endswith(PT2_SUFFIX)


def load_pt2(path: str) -> Any:
    """The ``torch.export.ExportedProgram`` saved in ``path``.

    Raises
    ------
    KilnFileNotFoundError
        If the file does not exist.
    KilnError
        If torch is not installed.
    FormatError
        If ``torch.export.load`` cannot read it.
    """
    require_file(path, "torch.export archive")
    try:
        import torch
    except ImportError as err:
        raise KilnError(f"{path}: reading .pt2 programs needs PyTorch ('pip install torch'; "
                        f"{err})") from None
    try:
        return torch.export.load(path)
    except Exception as err:  # noqa: BLE001 - zipfile / pickle / torch raise assorted types
        raise FormatError(f"{path}: not a readable torch.export archive "
                          f"({type(err).__name__}: {err})") from None


def import_pt2(path: str, shapes: Mapping[str, Sequence[int | str]] | None = None,
               dim_ranges: Mapping[str, tuple[int, int]] | None = None) -> tuple[Any, dict[str, Any]]:
    """``kiln.frontend.from_exported_program`` of a ``.pt2`` archive; returns ``(graph, params)``.

    ``dim_ranges`` (``--dim``) narrows the ranges of the program's dynamic dims (its
    ``torch.export.Dim`` s, by name or torch's symbol name).

    Raises
    ------
    InputError
        If ``shapes`` is given: a program's input shapes are fixed when it is exported, so
        ``--input-shape`` cannot change them (export again with other example inputs).
    """
    from .. import frontend

    if shapes:
        raise InputError(f"--input-shape does not apply to {path}: a torch.export program's "
                         f"input shapes are fixed when it is exported (export it again with "
                         f"example inputs of the shape you want)")
    if dim_ranges:
        return frontend.from_exported_program(load_pt2(path), dim_ranges=dict(dim_ranges))
    return frontend.from_exported_program(load_pt2(path))


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


def import_onnx(path_or_model: Any, shapes: Mapping[str, Sequence[int | str]] | None = None,
                dim_ranges: Mapping[str, tuple[int, int]] | None = None) -> tuple[Any, dict[str, Any]]:
    """``kiln.frontend.from_onnx`` with ``--input-shape`` overrides; returns ``(graph, params)``.

    A path ending in ``.pt2`` is a ``torch.export`` archive and goes to :func:`import_pt2`, so
    every subcommand that imports a model accepts both.

    Raises
    ------
    InputError
        If ``shapes`` names an input the model does not have (initializers do not count).
    """
    from .. import frontend

    if is_pt2(path_or_model):
        return import_pt2(path_or_model, shapes, dim_ranges)
    model = load_onnx_model(path_or_model) if isinstance(path_or_model, str) else path_or_model
    if shapes:
        inits = {t.name for t in model.graph.initializer}
        names = [vi.name for vi in model.graph.input if vi.name not in inits]
        unknown = sorted(set(shapes) - set(names))
        if unknown:
            raise InputError(f"--input-shape names unknown input(s) {unknown}; the model's inputs: {names}")
    if dim_ranges:
        return frontend.from_onnx(model, shape=dict(shapes) if shapes else None, dim_ranges=dict(dim_ranges))
    return frontend.from_onnx(model, shape=dict(shapes) if shapes else None)
