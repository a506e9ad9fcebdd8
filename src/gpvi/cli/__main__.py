"""``python -m gpvi.cli``: the ``gpvi`` command."""
import sys

from gpvi.cli.app import main

if __name__ == "__main__":
    sys.exit(main())
