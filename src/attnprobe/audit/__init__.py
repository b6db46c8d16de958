"""Audit a whole model: one extraction task per (layer, head or whole layer, learner, defence), run on a local
process pool or on Ray, with a report of what an attacker recovers under each output restriction."""

from attnprobe.audit.defenses import Defense, parse_defenses
from attnprobe.audit.engines import ENGINES, run_processes, run_ray
from attnprobe.audit.run import AuditRun, run_audit
from attnprobe.audit.tasks import TASK_KINDS, HeadSpec, Task, TaskKind, audit_learners, fitting_learners, run_task

__all__ = ["ENGINES", "TASK_KINDS", "AuditRun", "Defense", "HeadSpec", "Task", "TaskKind", "audit_learners",
           "fitting_learners", "parse_defenses", "run_audit", "run_processes", "run_ray", "run_task"]
