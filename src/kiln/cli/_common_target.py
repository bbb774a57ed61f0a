"""The CLI's default compilation target (kept apart so argument parsing imports nothing heavy)."""

#: ``kiln build`` / ``bench`` / ``demo`` compile for the machine they run on by default, the way
#: a user who deploys where they build expects; ``kiln.build``'s own default stays the portable
#: ``"llvm"`` (x86-64 baseline) as in TVM.
DEFAULT_CLI_TARGET = "llvm -mcpu=native"
