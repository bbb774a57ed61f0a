"""The ``kiln`` command line.

Each subcommand lives in its own module ``kiln/cli/<name>_cmd.py`` exposing
``register(subparsers)``, which adds an ``argparse`` sub-parser and sets its handler with
``parser.set_defaults(func=run)`` where ``run(args) -> int``. Adding a subcommand means
adding its module name to :data:`SUBCOMMANDS` and nothing else.

What several commands share lives in one module per concern, each importing only NumPy and
:mod:`kiln.runtime` at import time (ONNX, onnxruntime and the compiler load inside the
functions that need them), so ``kiln --help`` and the runtime commands work on a deploy-only
machine:

========================  ====================================================================
``args``                  default target, shared options, ``--input-shape`` / ``--input`` parsing
``model_io``              reading ONNX models and importing them into Kiln IR
``build_steps``           import -> ``kiln.build`` -> export, with the build's progress stages
``progress``              the stage-by-stage progress display on stderr
``library``               a compiled library to a graph module: factory, devices, threads, inputs
``latency``               latency statistics and their table
``compare``               errors against ONNX Runtime and its session
``graph_stats``           kernel counts and the memory plan of a graph JSON
``graphviz``              ``inspect --graph`` drawings (DOT, SVG through graphviz ``dot``)
``fmt``                   durations, byte counts and array summaries as text
========================  ====================================================================
"""
from __future__ import annotations

import argparse
import importlib
import sys
import traceback
from typing import Any, Sequence

from ..runtime.errors import KilnError

__all__ = ["main", "build_parser", "SUBCOMMANDS"]

#: Subcommand modules, in ``--help`` order (``kiln.cli.<name>_cmd``).
SUBCOMMANDS: list[str] = ["build", "run", "bench", "inspect", "demo", "tune"]


def build_parser() -> argparse.ArgumentParser:
    """Build the top-level parser with every available subcommand registered."""
    from .. import __version__

    parser = argparse.ArgumentParser(
        prog="kiln", description="Kiln: compile deep-learning models into one shared library and run them."
    )
    parser.add_argument("--version", action="version", version=f"kiln {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="show tracebacks and extra detail")
    sub = _Subparsers(parser.add_subparsers(dest="command", metavar="COMMAND"))
    for name in SUBCOMMANDS:
        try:
            mod = importlib.import_module(f".{name}_cmd", __name__)
        except ModuleNotFoundError as err:
            if err.name == f"{__name__}.{name}_cmd":
                continue  # not written yet / not shipped in this build
            _register_unavailable(sub, name, err)
            continue
        except Exception as err:  # noqa: BLE001 - one broken command must not break the others
            _register_unavailable(sub, name, err)
            continue
        mod.register(sub)
    return parser


class _Subparsers:
    """Wraps argparse's subparsers so every subcommand also accepts ``-v/--verbose``."""

    def __init__(self, action: argparse._SubParsersAction) -> None:
        self._action = action
        # SUPPRESS: a subcommand must not reset a --verbose given before it.
        self._common = argparse.ArgumentParser(add_help=False)
        self._common.add_argument(
            "-v", "--verbose", action="store_true", default=argparse.SUPPRESS, help="show tracebacks and extra detail"
        )

    def add_parser(self, name: str, **kwargs: Any) -> argparse.ArgumentParser:
        kwargs["parents"] = [self._common, *kwargs.get("parents", [])]
        return self._action.add_parser(name, **kwargs)

    def __getattr__(self, attr: str) -> Any:
        return getattr(self._action, attr)


def _register_unavailable(sub: Any, name: str, err: BaseException) -> None:
    p = sub.add_parser(name, help=f"(unavailable: {err})", add_help=False)
    p.add_argument("rest", nargs=argparse.REMAINDER)

    def run(args: argparse.Namespace) -> int:
        raise KilnError(f"'kiln {name}' is unavailable here: {type(err).__name__}: {err}")

    p.set_defaults(func=run)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``kiln`` command; returns the process exit code.

    User errors (:class:`~kiln.runtime.errors.KilnError`) print ``kiln: error: <message>`` on
    one line and return 1; ``--verbose`` adds the traceback.
    """
    parser = build_parser()
    args = parser.parse_args(list(argv) if argv is not None else None)
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help(sys.stderr)
        return 2
    try:
        return int(func(args) or 0)
    except KilnError as err:
        verbose = getattr(args, "verbose", False)
        if verbose:
            traceback.print_exc()
        msg = str(err) if verbose else " ".join(str(err).split("\n")[0].split())
        print(f"kiln: error: {msg}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("kiln: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # e.g. `kiln inspect x.so | head`
        return 0
