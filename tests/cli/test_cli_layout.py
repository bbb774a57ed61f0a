"""Layer rules of ``kiln.cli``: reachable from ``import kiln`` without being imported by it, and
the runtime commands (``run``, ``bench LIB.so``, ``inspect``) need no compiler dependency."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from tests.runtime.import_blocker import COMPILER_SIDE as BLOCKED
from tests.runtime.import_blocker import blocker_prelude


def _python(script: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, timeout=300)


def test_kiln_cli_is_an_attribute_of_kiln_loaded_on_first_use(tmp_path):
    # `import kiln` stays cheap (no argparse, no subcommand modules) yet `kiln.cli.main` works.
    script = textwrap.dedent(
        """
        import sys
        import kiln
        assert "kiln.cli" not in sys.modules, "import kiln imported kiln.cli"
        assert "cli" in dir(kiln)
        rc = kiln.cli.main(["inspect", sys.argv[1]])
        assert rc == 1, rc
        print("CLI OK")
        """
    )
    proc = _python(script, str(tmp_path / "missing.so"))
    assert proc.returncode == 0 and "CLI OK" in proc.stdout, proc.stdout + proc.stderr
    assert "kiln: error:" in proc.stderr and "missing.so" in proc.stderr


DEPLOY_ONLY = blocker_prelude(BLOCKED) + textwrap.dedent(
    """
    import importlib, pkgutil
    import kiln.cli
    for info in pkgutil.iter_modules(kiln.cli.__path__):
        if info.name != "__main__":  # importing it would run the command line
            importlib.import_module("kiln.cli." + info.name)
    usage = kiln.cli.build_parser().format_help()
    assert "unavailable" not in usage, usage
    lib = sys.argv[1]
    for argv in (["run", lib], ["bench", lib, "--repeat", "2", "--warmup", "0"], ["inspect", lib]):
        assert kiln.cli.main(argv) == 0, argv
    leaked = sorted(n for n in sys.modules if any(n == b or n.startswith(b + ".") for b in BLOCKED))
    assert not leaked, leaked
    print("DEPLOY-ONLY OK")
    """
)


def test_runtime_commands_need_no_compiler(tmp_path):
    # Every cli module imports (so `kiln --help` lists every command as available) and the
    # commands that take a compiled library run, with ONNX, onnxruntime and the compiler
    # unimportable: the promise of a deploy-only install.
    pytest.importorskip("onnx")
    from tests.cli.cli_support import kiln, tiny_model

    lib = str(tmp_path / "tiny.so")
    built = kiln("build", tiny_model(str(tmp_path / "tiny.onnx")), "-o", lib, "-q")
    assert built.returncode == 0, built.stderr
    proc = _python(DEPLOY_ONLY, lib)
    assert proc.returncode == 0 and "DEPLOY-ONLY OK" in proc.stdout, proc.stdout + proc.stderr
