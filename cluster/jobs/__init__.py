"""The jobs every command runs; the commands (cluster/commands/) only parse arguments and print.

``run_search`` (``placer search``, and each row of ``placer reproduce``; cluster/jobs/search.py): graph +
machine + policy + measurer + budget -> a run folder and the best placement::

    load graph and machine, group the graph           (graphs/, measurers/)
    start or join Ray, start the measurer pool        (cluster/pool.py)
    score the quick baselines through the pool        (policies/table.py)
    run the policy through policies.registry.place  (learned or not; learned ones get a RunContext)
      every batch goes to the pool in one call, every result into the run log
    final table against the baselines and the lower bound; the run log is compacted on a clean finish

``run_baselines`` (``placer baselines``; cluster/jobs/baselines.py): every named non-learned policy scored
side by side by one measurer (the simulator in this process, or the pool for real measurers), optionally logged.

The run folder is the run log of cluster/runlog.py plus ``checkpoint/`` (the learner) and
``grouping.npz``. ``resume`` continues a stopped run: the learner's weights and RNG come back from the
checkpoint, and placements already in the log are answered from it instead of being measured again. Its
settings come from its manifest except those given explicitly (``search_config``, ``resume_config``;
cluster/jobs/resume.py): a higher budget or a time limit is recorded in the manifest, a change of what it
searches is refused. The measurer a search's policy sees is ``LoggedPoolMeasurer`` (cluster/jobs/logged.py).
"""

from __future__ import annotations

from cluster.jobs.baselines import BaselinesOutcome, run_baselines
from cluster.jobs.config import (BASELINES_FILE, CHECKPOINT_DIR, GROUPING_FILE, QUICK_BASELINES, BaselinesConfig,
                                 SearchConfig)
from cluster.jobs.logged import LoggedPoolMeasurer, expand_logged, log_placement
from cluster.jobs.resume import resume_config, search_config
from cluster.jobs.search import SearchResult, check_search_config, run_search

__all__ = ["BASELINES_FILE", "CHECKPOINT_DIR", "GROUPING_FILE", "QUICK_BASELINES", "BaselinesConfig",
           "BaselinesOutcome", "LoggedPoolMeasurer", "SearchConfig", "SearchResult", "check_search_config",
           "expand_logged", "log_placement", "resume_config", "run_baselines", "run_search", "search_config"]
