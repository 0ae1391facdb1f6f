"""``python -m dpteach ...`` is the ``dpteach`` command, for environments where scripts are not on PATH."""
import sys

from .cli import main

sys.exit(main())
