"""``python -m attnprobe`` runs the command line.

``python -m`` puts the current directory first on ``sys.path``; it is taken off again so that files there
(a ``tqdm.py``, a ``cvxpy.py``) cannot shadow installed modules. ``--oracle MODULE:ATTR`` still finds MODULE
in the current directory (:func:`attnprobe.oracles.load.import_from_cwd`).
"""

import os
import sys

if sys.path and sys.path[0] in ("", os.getcwd()):
    del sys.path[0]

from attnprobe.cli import main  # noqa: E402

sys.exit(main())
