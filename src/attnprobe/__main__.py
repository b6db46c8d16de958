"""``python -m attnprobe`` runs the command line."""

import sys

from attnprobe.cli import main

sys.exit(main())
