"""`python -m cli` runs the `trainyard` command."""

import sys

from cli.main import main

sys.exit(main())
