"""A discrete-event simulator of LLM engine replicas behind the gateway (``bench/agent_replicas.py``).

:mod:`~bench.replica_sim.profile` the engine profile and its sources, :mod:`~bench.replica_sim.kvcache`
a replica's prefix cache, :mod:`~bench.replica_sim.engine` a replica's continuous batching,
:mod:`~bench.replica_sim.traces` agent and chat traces, :mod:`~bench.replica_sim.run` one run through
the gateway's selection code (:mod:`gateway.balancing`), :mod:`~bench.replica_sim.search` the goodput
search, :mod:`~bench.replica_sim.plan` what the benchmark runs, :mod:`~bench.replica_sim.report` tables
and plots.
"""

from bench.replica_sim.profile import EngineProfile
from bench.replica_sim.run import RunResult, RunSpec, simulate
from bench.replica_sim.search import Goodput, find_goodput
from bench.replica_sim.traces import TraceParams

__all__ = ["EngineProfile", "Goodput", "RunResult", "RunSpec", "TraceParams", "find_goodput", "simulate"]
