"""Drivers of external tools: the CUDA compiler (:mod:`.nvrtc`), and the TVM-style names
:mod:`.cc` and :mod:`.tar` of the C compiler driver and archive reader that live in
:mod:`kiln.runtime` (the runtime needs them at deploy time). Imports only :mod:`kiln.runtime`.
"""
