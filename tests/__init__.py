"""Kiln's test suite, a package so that test modules import shared helpers by their full name.

Helpers shared by several test modules live in plain modules (``tests/topi/harness.py``,
``tests/frontend/onnx_check.py``, ...) and are imported as ``from tests.topi.harness import ...``;
fixtures live in the ``conftest.py`` of the folder that needs them. No test module imports another
test module's file by path or edits ``sys.path``.
"""
