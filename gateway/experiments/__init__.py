"""A/B experiments while serving: assignment on the request path, shadow arms after it, and the
background guardrails, stop polling and adaptive allocation of every replica.

- :mod:`.assignment`: one experiment's arm for a request's key (hash + bisect; adaptive: cached,
  stored once per key).
- :mod:`.shadow`: shadow arms' decisions (and, opted in, their bounded backend calls).
- :mod:`.monitor`: guardrails, stops shared through the store, adaptive allocation updates.
- :mod:`.runtime`: :class:`ExperimentRuntime`, what the proxy service holds.

The schema and the pure parts (hashing, Thompson sampling, the guardrail tests) live in
``policies/experiments``.
"""

from gateway.experiments.assignment import Assignment, LiveExperiment
from gateway.experiments.runtime import ExperimentRuntime

__all__ = ["Assignment", "ExperimentRuntime", "LiveExperiment"]
