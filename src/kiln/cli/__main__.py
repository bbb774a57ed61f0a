"""``python -m kiln.cli``."""

from . import main

raise SystemExit(main())
