"""`python -m bebop ...`: the same command line as `bebop ...`."""

import sys

from bebop.cli import main

sys.exit(main())
