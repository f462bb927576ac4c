"""`python -m trainyard.cli` runs the `trainyard` command."""

import sys

from trainyard.cli.main import main

sys.exit(main())
