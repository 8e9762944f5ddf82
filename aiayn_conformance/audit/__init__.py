"""The audit pipeline behind ``aiayn audit``: suite runs planned and run (``runner``), their records folded into
statuses (``results``), rendered (``report``, ``ci_report``, ``figures``), sharded and merged (``shards``,
``merge``), each finding placed on the adapter's own lines (``locations``); ``command`` is the sub-command."""

from .command import add_parser, run
from .results import AuditResult, ClauseResult, SubjectResult, fold
from .runner import Job, Progress, audit, plan, run_job, take_shard

__all__ = ["AuditResult", "ClauseResult", "Job", "Progress", "SubjectResult", "add_parser", "audit", "fold", "plan",
           "run", "run_job", "take_shard"]
