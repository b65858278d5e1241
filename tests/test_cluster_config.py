"""cluster.yaml passes the schema that `ray up` checks, and each node type's `node_config` the EC2 request it becomes
(offline: docs/cluster.md#validating-clusteryaml-offline)."""
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


def node_config_problems(cfg):
    """Each node type's `node_config` checked as the EC2 RunInstances request Ray's AWS provider sends it as
    (`ec2.create_instances(**node_config, MinCount=1, MaxCount=1, ...)`), against botocore's model of that request:
    Ray's schema leaves `node_config` an open object, so a misspelt field would reach AWS only at `ray up`."""
    import botocore.session
    from botocore.validate import ParamValidator

    shape = botocore.session.get_session().get_service_model("ec2").operation_model("RunInstances").input_shape
    problems = []
    for name, node_type in cfg["available_node_types"].items():
        report = ParamValidator().validate({**node_type["node_config"], "MinCount": 1, "MaxCount": 1}, shape)
        if report.has_errors():
            problems.append(f"{name}: {report.generate_report()}")
    return problems


def test_every_node_config_of_cluster_yaml_is_a_valid_ec2_launch_request():
    assert node_config_problems(yaml.safe_load((REPO / "cluster.yaml").read_text())) == []


@pytest.mark.parametrize("path, typo", [(("InstanceType",), "InstanceTyp"),
                                        (("BlockDeviceMappings", 0, "Ebs", "VolumeSize"), "VolumeSise"),
                                        (("InstanceMarketOptions", "MarketType"), "Markettype")])
def test_a_typo_inside_a_node_config_is_caught_naming_the_node_type_and_the_field(path, typo):
    cfg = yaml.safe_load((REPO / "cluster.yaml").read_text())
    parent = cfg["available_node_types"]["gpu_worker"]["node_config"]
    for key in path[:-1]:
        parent = parent[key]
    parent[typo] = parent.pop(path[-1])
    assert validate_config_passes(cfg)  # Ray's own schema lets it through
    (problem,) = node_config_problems(cfg)
    assert problem.startswith("gpu_worker:") and typo in problem


def validate_config_passes(cfg):
    import copy

    from ray.autoscaler._private.util import prepare_config, validate_config

    validate_config(prepare_config(copy.deepcopy(cfg)))
    return True
