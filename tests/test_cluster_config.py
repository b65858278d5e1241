"""cluster.yaml passes the schema that `ray up` checks (offline: docs/cluster.md#validating-clusteryaml-offline)."""
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]


def test_cluster_yaml_validates_against_rays_cluster_schema():
    from ray.autoscaler._private.util import prepare_config, validate_config

    validate_config(prepare_config(yaml.safe_load((REPO / "cluster.yaml").read_text())))


def test_a_typo_in_cluster_yaml_is_caught_by_the_same_check():
    from ray.autoscaler._private.util import prepare_config, validate_config

    cfg = yaml.safe_load((REPO / "cluster.yaml").read_text())
    cfg["max_worker"] = cfg.pop("max_workers")
    with pytest.raises(Exception, match="max_worker"):
        validate_config(prepare_config(cfg))


def test_the_cluster_opens_only_ssh_and_only_to_one_address():
    import yaml

    cfg = yaml.safe_load((REPO / "cluster.yaml").read_text())
    rules = cfg["provider"]["security_group"]["IpPermissions"]
    assert [(r["FromPort"], r["ToPort"], r["IpProtocol"]) for r in rules] == [(22, 22, "tcp")]
    cidrs = [ip["CidrIp"] for r in rules for ip in r["IpRanges"]]
    assert cidrs and "0.0.0.0/0" not in cidrs and all(c.endswith("/32") for c in cidrs)
