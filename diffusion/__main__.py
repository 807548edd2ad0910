"""``python -m diffusion <command>``: see ``diffusion.cli``."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
