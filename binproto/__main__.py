"""``python -m binproto``: the command line (see :mod:`binproto.cli`)."""

import sys

from binproto.cli import main

if __name__ == "__main__":
    sys.exit(main())
