"""What every learner runs on, knowing no family: the run skeleton (:mod:`.skeleton`: :class:`Run`), the typed
results (:mod:`.result`: :class:`Extraction`; :mod:`.check`: :class:`CheckResult` and the functional check;
:mod:`.estimate`: :class:`QueryCount` and :class:`Estimate`), the registry (:mod:`.registry`: a learner's options,
capabilities and estimate) and what a learner may ask of an oracle (:mod:`.oracle`).

A new learner needs only this package::

    from attnprobe.learners.core import Option, QueryCount, Run, register
"""

from attnprobe.learners.core.check import CheckResult, functional_check
from attnprobe.learners.core.estimate import Estimate, QueryCount, Setting, estimate_queries
from attnprobe.learners.core.registry import Capabilities, Learner, Option, register
from attnprobe.learners.core.result import Extraction
from attnprobe.learners.core.skeleton import Run

__all__ = ["Capabilities", "CheckResult", "Estimate", "Extraction", "Learner", "Option", "QueryCount", "Run",
           "Setting", "estimate_queries", "functional_check", "register"]
