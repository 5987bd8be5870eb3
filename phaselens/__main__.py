"""``python -m phaselens``: the ``phaselens`` command."""

import sys

from phaselens.cli import main

sys.exit(main())
