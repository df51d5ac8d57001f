"""ray_config.yaml passes Ray's own cluster-launcher validation offline, and so does its on-premises variant."""

from __future__ import annotations

import copy
from pathlib import Path

import jsonschema
import pytest
import yaml
from ray.autoscaler._private.util import prepare_config, validate_config

CONFIG_PATH = Path(__file__).resolve().parents[2] / "ray_config.yaml"
ONPREM_MARKER = "# ---- On-premises variant"


def _config() -> dict:
    return yaml.safe_load(CONFIG_PATH.read_text())


def _onprem_config() -> dict:
    """The commented block at the end of the file, uncommented."""
    block = CONFIG_PATH.read_text().split(ONPREM_MARKER, 1)[1].splitlines()[1:]
    lines = [line[2:] for line in block if line.startswith("# ") and not line.startswith("# Machines")
             and not line.startswith("# on the workers")]
    return yaml.safe_load("\n".join(lines))


def test_ray_config__passes_ray_validation_offline():
    validate_config(prepare_config(_config()))


def test_ray_config__onprem_variant_passes_ray_validation():
    config = _onprem_config()
    assert config["provider"]["type"] == "local" and len(config["provider"]["worker_ips"]) == 2
    validate_config(prepare_config(config))


def test_ray_config__validation_is_not_vacuous():
    broken = copy.deepcopy(_config())
    broken["available_node_types"]["gpu4"]["resources"] = "four GPUs"
    with pytest.raises(jsonschema.ValidationError):
        validate_config(prepare_config(broken))


def test_ray_config__gpu_workers_carry_gpus_labels_and_the_pinned_install():
    config = _config()
    workers = {k: v for k, v in config["available_node_types"].items() if k != config["head_node_type"]}
    assert workers and all(v["resources"]["GPU"] >= 2 for v in workers.values())
    assert all(v["labels"]["placer/role"] == "measurer" for v in workers.values())
    assert config["available_node_types"][config["head_node_type"]]["resources"]["GPU"] == 0
    setup = " ".join(config["setup_commands"])
    assert "torch==2.13.0" in setup and "'ray[default,rllib]==2.60.0'" in setup and "~/placer" in setup


def test_ray_config__the_head_gives_a_stopped_job_time_to_exit():
    """`ray job stop` SIGKILLs a job still running after RAY_JOB_STOP_WAIT_TIME_S (3 s by default): a search
    stopped on a busy head was killed while Python unloaded torch and Ray, after its log was flushed, never
    reaching its exit status 130."""
    for config in (_config(), _onprem_config()):
        head_start = " ".join(c for c in config["head_start_ray_commands"] if "ray start" in c)
        assert "RAY_JOB_STOP_WAIT_TIME_S=30 ray start --head" in head_start


def test_ray_config__token_authentication_stays_on():
    for config in (_config(), _onprem_config()):
        starts = config["head_start_ray_commands"] + config["worker_start_ray_commands"]
        assert all("RAY_AUTH_MODE=token" in c for c in starts if "ray start" in c)
        assert config["file_mounts"]["~/.ray/auth_token"] == "~/.ray/auth_token"
        assert "--labels=placer/role=measurer" in " ".join(config["worker_start_ray_commands"]) or \
            config["provider"]["type"] != "local"
