"""The jobs every command runs; the commands (cluster/commands/) only parse arguments and print.

- ``run_search`` (cluster/jobs/search.py): ``placer search`` and each row of ``placer reproduce``; the
  module's docstring draws the job. Its settings are ``SearchConfig`` (config.py); which of them a
  resumed run keeps is resume.py; the measurer its policy sees is ``LoggedPoolMeasurer`` (logged.py);
  where a learner's warm start comes from is warm_start.py.
- ``run_baselines`` (cluster/jobs/baselines.py): ``placer baselines``, every named non-learned policy
  scored side by side by one measurer, optionally logged.
"""

from __future__ import annotations

from cluster.jobs.baselines import BaselinesOutcome, run_baselines
from cluster.jobs.config import (BASELINES_FILE, CHECKPOINT_DIR, GROUPING_FILE, QUICK_BASELINES, BaselinesConfig,
                                 SearchConfig)
from cluster.jobs.logged import LoggedPoolMeasurer, expand_logged, log_placement
from cluster.jobs.resume import resume_config, search_config
from cluster.jobs.search import CheckedSearch, SearchInterrupted, SearchResult, check_search_config, run_search

__all__ = ["BASELINES_FILE", "CHECKPOINT_DIR", "GROUPING_FILE", "QUICK_BASELINES", "BaselinesConfig",
           "BaselinesOutcome", "CheckedSearch", "LoggedPoolMeasurer", "SearchConfig", "SearchInterrupted",
           "SearchResult", "check_search_config", "expand_logged", "log_placement", "resume_config", "run_baselines",
           "run_search", "search_config"]
