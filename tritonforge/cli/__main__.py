"""`python -m tritonforge.cli ...`: the `tritonforge` command."""

import sys

from .main import main

sys.exit(main())
