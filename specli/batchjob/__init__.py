"""``specli run --batch FILE``: many prompts through one loaded model, one JSON line each.

The package, by job: :mod:`.items` (the batch file's lines, checked), :mod:`.runner` (the items
through one Session: one after another, or N at once in the batch engine ``serve --parallel``
uses; :func:`~.runner.record` makes each output line), :mod:`.output` (the output in input
order; an ``--out`` file that a restarted job resumes), :mod:`.progress` (the progress bar),
:mod:`.job` (the job, start to end, and its exit status)."""

from specli.batchjob.items import BadLine, BatchItem, read_items
from specli.batchjob.job import STRICT_EXIT, BatchOptions, run_job
from specli.batchjob.runner import Defaults, record

__all__ = ["STRICT_EXIT", "BadLine", "BatchItem", "BatchOptions", "Defaults", "read_items", "record", "run_job"]
