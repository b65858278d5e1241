"""Each Ray worker computes on its own device (issue #42): the rule of `ray.train.torch.get_device`, written as
`devices.device_for_worker`, checked with made-up lists of visible GPUs (no GPU needed), and a Tune-style Ray
task that asks Ray for its device on this CPU-only machine."""
from __future__ import annotations

import pytest
import torch

from alignlab.platform.runtime.devices import device_for_worker, device_name, use_device


def test_four_workers_sharing_a_node_each_take_their_own_gpu():
    # Ray Train shows every worker of a node the node's GPUs; a bare "cuda" would be GPU 0 for all four.
    assert [device_for_worker([g], "0,1,2,3", True) for g in (0, 1, 2, 3)] == \
        [torch.device(f"cuda:{i}") for i in range(4)]


def test_the_device_index_is_the_position_in_cuda_visible_devices_not_the_physical_id():
    assert device_for_worker([2], "2,3", True) == torch.device("cuda:0")
    assert device_for_worker(["3"], "2,3", True) == torch.device("cuda:1")
    assert device_for_worker([5], "5", True) == torch.device("cuda:0")  # a Tune trial given GPU 5 alone


def test_a_worker_with_several_gpus_computes_on_its_lowest():
    assert device_for_worker(["3", "2"], "0,1,2,3", True) == torch.device("cuda:2")
    assert device_for_worker([10, 9], "8,9,10,11", True) == torch.device("cuda:1")  # 9 < 10 as numbers


def test_without_cuda_visible_devices_the_ids_are_physical_indices():
    assert device_for_worker([1], None, True) == torch.device("cuda:1")


def test_no_gpu_or_no_cuda_means_the_cpu():
    assert device_for_worker([], "0,1", True) == torch.device("cpu")
    assert device_for_worker([1], "0,1", False) == torch.device("cpu")


def test_a_gpu_missing_from_cuda_visible_devices_is_an_error_that_names_both():
    with pytest.raises(ValueError, match=r"assigned GPU 3 but CUDA_VISIBLE_DEVICES='0,1'"):
        device_for_worker([3], "0,1", True)


def test_the_cpu_device_is_named_cpu_and_using_it_changes_nothing():
    assert device_name("cpu") == "cpu"
    assert use_device(torch.device("cpu")) == torch.device("cpu")


@pytest.mark.ray
def test_a_ray_task_without_gpus_asks_ray_and_gets_the_cpu(ray_session):
    import ray

    from alignlab.platform.study.grid import trial_device

    @ray.remote(num_cpus=0.1)
    def where():
        return trial_device(), ray.get_gpu_ids()

    assert ray.get(where.remote()) == ("cpu", [])
