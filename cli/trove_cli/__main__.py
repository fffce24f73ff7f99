"""`python -m trove_cli` is the `trove` command."""

import sys

from trove_cli.main import main

sys.exit(main())
