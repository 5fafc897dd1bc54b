"""In-layer micro-workflows: cascade, fusion, ratings and bounded graphs, executed over the same
forwarding path as a single call (retries, breaker, fallbacks, cost), one decision record with the
sub-call tree.

The schema lives in :mod:`policies.workflows`; here is what runs it:

- :mod:`.runner`: :class:`WorkflowRunner`, one per process (sub-call slots, heads), runs a workflow.
- :mod:`.runtime`: one run — sub-calls through the forwarder, within the caps, recorded.
- :mod:`.caps`: the run's budget (steps, tokens, cost).
- :mod:`.cascade`, :mod:`.fusion`, :mod:`.ratings`, :mod:`.graph`: the kinds.
- :mod:`.confidence`, :mod:`.judging`: how answers are scored.
- :mod:`.bodies`: what each sub-call sends.
- :mod:`.outcome`, :mod:`.respond`, :mod:`.sse`: the record, the response, streams.
"""

from gateway.workflows.respond import WorkflowDone
from gateway.workflows.runner import WorkflowRunner, preflight

__all__ = ["WorkflowDone", "WorkflowRunner", "preflight"]
