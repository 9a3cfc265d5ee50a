"""`python -m api.cli`: the same as the `ledgerlm` command."""
import sys

from api.cli.main import main

sys.exit(main())
