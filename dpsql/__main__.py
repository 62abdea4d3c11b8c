"""``python -m dpsql ...``: the command line, the same as the ``dpsql`` script."""

import sys

from dpsql.cli import main

if __name__ == "__main__":
    sys.exit(main())
