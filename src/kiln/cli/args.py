"""Command-line values shared by the ``kiln`` subcommands: the options several commands take,
and the parsers that turn their strings into shapes, arrays, file paths and targets.

Owns: the CLI's default target, ``--target`` / ``--input-shape`` option definitions, shape and
input-file parsing, file checks. Imports NumPy and :mod:`kiln.runtime.errors` only; the target
parser is imported inside :func:`check_target` so ``kiln --help`` needs no compiler.
"""

from __future__ import annotations

import argparse
import os
import re
from typing import Any, Sequence

import numpy as np

from ..runtime.errors import InputError, KilnFileNotFoundError

__all__ = [
    "DEFAULT_CLI_TARGET", "add_target_option", "add_input_shape_option", "parse_input_shapes",
    "parse_dim_ranges",
    "parse_input_files", "require_file", "model_kind", "check_target",
]

#: ``kiln build`` / ``bench`` / ``demo`` / ``tune`` / ``inspect --plan`` compile for the machine
#: they run on by default, the way a user who deploys where they build expects; ``kiln.build``'s
#: own default stays the portable ``"llvm"`` (x86-64 baseline) as in TVM.
DEFAULT_CLI_TARGET = "llvm -mcpu=native"

_SHAPE_HELP = ("expected NAME:D1,D2,... with integer or named dims (e.g. data:1,3,224,224 or "
               "input_ids:1,seq with --dim seq=1..512)")


# ------------------------------------------------------------------------------ options
def add_target_option(parser: argparse._ActionsContainer, help: str) -> None:
    """Add ``--target T`` (default :data:`DEFAULT_CLI_TARGET`) with a command's own help text."""
    parser.add_argument("--target", default=DEFAULT_CLI_TARGET, metavar="T", help=help)


def add_input_shape_option(parser: argparse._ActionsContainer, help: str) -> None:
    """Add the repeatable ``--input-shape NAME:DIMS`` (read with :func:`parse_input_shapes`) and
    ``--dim NAME=LO..HI`` (read with :func:`parse_dim_ranges`)."""
    parser.add_argument("--input-shape", action="append", default=[], metavar="NAME:DIMS", help=help)
    parser.add_argument("--dim", action="append", default=[], metavar="NAME=LO..HI",
                        help="range of a dynamic dimension (an ONNX dim_param or a name used in --input-shape), "
                             "e.g. seq=1..512; the library accepts every size in the range (repeatable)")


def parse_dim_ranges(specs: Sequence[str] | None) -> dict[str, tuple[int, int]]:
    """Parse ``--dim`` values ``seq=1..512`` into ``{"seq": (1, 512)}``.

    Raises
    ------
    InputError
        On a malformed spec, a bad range or a repeated name.
    """
    from ..runtime import sym

    out: dict[str, tuple[int, int]] = {}
    for spec in specs or ():
        name, rng = sym.parse_range(spec)
        if name in out:
            raise InputError(f"bad --dim: dimension {name!r} given twice")
        out[name] = rng
    return out


# ------------------------------------------------------------------------------ parsing
def parse_input_shapes(specs: Sequence[str] | None) -> dict[str, tuple[int | str, ...]]:
    """Parse ``--input-shape`` values ``name:1,3,224,224`` into ``{name: (1, 3, 224, 224)}``.

    A dim that is a name (``input_ids:1,seq``) is a dynamic dimension; its range comes from
    ``--dim`` (:func:`parse_dim_ranges`).

    The shape is what follows the *last* colon (so TensorFlow-style names such as
    ``input:0:1,3,8,8`` work); dimensions are separated by commas (or ``x``); an empty shape
    (``name:``) is a scalar.

    Parameters
    ----------
    specs : sequence of str or None
        The ``--input-shape`` values as given.

    Returns
    -------
    dict of str to tuple of (int or str)
        Shape per input name, in the order given.

    Raises
    ------
    InputError
        On a malformed spec or a repeated name.
    """
    shapes: dict[str, tuple[int | str, ...]] = {}
    for spec in specs or ():
        name, sep, dims = spec.rpartition(":")
        if not sep or not name:
            raise InputError(f"bad --input-shape {spec!r}: {_SHAPE_HELP}")
        dims = dims.strip()
        if not re.search(r"[A-Za-z_]", dims.replace("x", "").replace("X", "")):
            dims = dims.replace("x", ",").replace("X", ",")  # 1x3x224x224
        if dims in ("", "()", "[]"):
            shape: tuple[int | str, ...] = ()
        else:
            parts = [p.strip() for p in dims.strip("()[]").split(",")]
            if not all(re.fullmatch(r"\d+|[A-Za-z_][A-Za-z0-9_]*", p) for p in parts):
                raise InputError(f"bad --input-shape {spec!r}: dimensions must be integers or names; {_SHAPE_HELP}")
            shape = tuple(int(p) if p.isdigit() else p for p in parts)
            if any(isinstance(d, int) and d <= 0 for d in shape):
                raise InputError(f"bad --input-shape {spec!r}: dimensions must be positive; {_SHAPE_HELP}")
        if name in shapes:
            raise InputError(f"bad --input-shape: input {name!r} given twice")
        shapes[name] = shape
    return shapes


def parse_input_files(specs: Sequence[str] | None) -> dict[str, np.ndarray]:
    """Parse ``--input`` values: ``name=file.npy`` (one array) or ``file.npz`` (arrays by name).

    Raises
    ------
    InputError
        On a malformed spec, a file NumPy cannot read, or an ``.npz`` without the named array.
    KilnFileNotFoundError
        If a named file does not exist.
    """
    arrays: dict[str, np.ndarray] = {}
    for spec in specs or ():
        name, sep, path = spec.partition("=")
        if not sep:
            if spec.endswith(".npz"):
                require_file(spec, "input file")
                with _load_np(spec) as npz:
                    for k in npz.files:
                        arrays[k] = np.asarray(npz[k])
                continue
            raise InputError(f"bad --input {spec!r}: expected NAME=FILE.npy or FILE.npz")
        if not name or not path:
            raise InputError(f"bad --input {spec!r}: expected NAME=FILE.npy or FILE.npz")
        require_file(path, "input file")
        data = _load_np(path)
        if isinstance(data, np.lib.npyio.NpzFile):
            with data:
                if name in data.files:
                    arrays[name] = np.asarray(data[name])
                elif len(data.files) == 1:
                    arrays[name] = np.asarray(data[data.files[0]])
                else:
                    raise InputError(f"--input {spec!r}: {path} holds {data.files}, none called {name!r}")
        else:
            arrays[name] = np.asarray(data)
    return arrays


def _load_np(path: str) -> Any:
    # allow_pickle=False: an input file must never run code.
    try:
        return np.load(path, allow_pickle=False)
    except (ValueError, OSError, EOFError) as err:
        raise InputError(f"cannot read {path} as a NumPy .npy/.npz file ({err})") from None


def require_file(path: str, what: str = "file") -> str:
    """Return ``path`` if it is an existing file.

    Raises
    ------
    KilnFileNotFoundError
        If nothing exists at ``path``.
    InputError
        If ``path`` is not a regular file (e.g. a directory).
    """
    if not os.path.exists(path):
        raise KilnFileNotFoundError(f"{what} not found: {path}")
    if not os.path.isfile(path):
        raise InputError(f"{what} is not a file: {path}")
    return path


def model_kind(path: str) -> str:
    """``"onnx"`` for an ONNX model, ``"lib"`` for a compiled library (.so / .tar / other)."""
    return "onnx" if path.lower().endswith(".onnx") else "lib"


def check_target(target: str) -> Any:
    """Parse a target string (``llvm``, ``c``, ``llvm -mcpu=native`` ...) into a ``Target``.

    Raises
    ------
    TargetError
        If the target is unknown or malformed.
    """
    from ..target import Target

    return Target(target)
