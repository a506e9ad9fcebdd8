"""``python -m gpvi.cli``: the ``gpvi`` command."""
import sys

from gpvi.cli.app import main

sys.exit(main())
