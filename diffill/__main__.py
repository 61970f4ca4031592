"""`python -m diffill ...`: the same as the `diffill` command."""

import sys

from diffill.cli import main

sys.exit(main())
