"""Each data-parallel rank reads only its own rows (issue #42): `pretrain.driver.data_config` on real Ray Data and a
real 2-worker TorchTrainer. One worker streams the whole dataset unsplit (the rows every single-worker model was
trained on); two workers each stream a disjoint half; the same half in the same order on every run (what an exact
resume needs) is test_exact_at_any_shape.py's."""
from __future__ import annotations

import dataclasses
import json

import pytest

from alignlab.platform.presets import Preset

ONE = dataclasses.replace(Preset.named("smoke").pretrain, cpus_per_worker=0.25, threads_per_worker=1)
TWO = dataclasses.replace(ONE, num_workers=2)


def test_one_worker_streams_the_whole_dataset_and_several_split_only_the_training_streams():
    from alignlab.platform.pretrain.driver import data_config

    assert data_config(ONE, {"train": 0, "eval": 0})._datasets_to_split == []
    cfg = data_config(TWO, {"train": 0, "domain": 0, "eval": 0})
    assert cfg._datasets_to_split == ["train", "domain"]  # "eval": rank 0 evaluates all of it
    assert all(o.preserve_order for o in cfg._user_execution_options.values())


def test_the_split_names_other_models_only_for_several_workers():
    from alignlab.platform.pretrain.models import model_id

    # The mini preset (1 worker) keeps the id it had before the split (pinned in bf16, which "auto" resolves to only
    # on CPUs where it trains faster; the pin moves with PRETRAIN_CODE_VERSION, which is in every id); data-parallel
    # workers name another model.
    mini = dataclasses.replace(Preset.named("mini").pretrain, precision="bf16")
    assert model_id("bundled-dabc0247e631", mini) == "128x2-mlm-6e3c0c9c2999"  # [CLS] exempt from the bias: #65
    biased_cls = dataclasses.replace(mini, model=dataclasses.replace(mini.model, alibi_exempt_cls=False))
    assert model_id("bundled-dabc0247e631", biased_cls) == "128x2-mlm-4e053eabe6a6"  # the id it had before
    assert model_id("bundled-dabc0247e631", dataclasses.replace(mini, num_workers=2)) != model_id(
        "bundled-dabc0247e631", mini)
    paper = Preset.named("paper").pretrain
    assert model_id("bundled-dabc0247e631", paper) == "768x3-mlm-f5f199592455"
    assert model_id("bundled-dabc0247e631", dataclasses.replace(paper, num_workers=4)) == "768x3-mlm-b9e352a3997f"


# The same halves in the same order on every run: test_exact_at_any_shape.py compares each rank's rows, step by step,
# between two runs of a real pretraining (under 2 and under 4 Ray CPUs).
@pytest.mark.ray
def test_two_ranks_stream_disjoint_halves_that_together_hold_every_row(ray_session, tmp_path):
    import ray.data
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    from alignlab.platform.pretrain.driver import data_config

    out = tmp_path / "out"
    out.mkdir()

    def read_my_rows(config):
        import ray.train

        rank = ray.train.get_context().get_world_rank()
        shard = ray.train.get_dataset_shard("train")
        ids = [int(x) for b in shard.iter_batches(batch_size=8, batch_format="numpy") for x in b["id"]]
        (config["out"] / f"rank{rank}.json").write_text(json.dumps(ids))

    ds = ray.data.range(96, override_num_blocks=4)
    TorchTrainer(read_my_rows, train_loop_config={"out": out},
                 scaling_config=ScalingConfig(num_workers=2, resources_per_worker={"CPU": 0.25}),
                 datasets={"train": ds}, dataset_config=data_config(TWO, {"train": ds}),
                 run_config=RunConfig(name="split", storage_path=str(tmp_path / "ray"))).fit()
    a0, a1 = (json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1))
    assert len(a0) == len(a1) == 48 and not set(a0) & set(a1) and sorted(a0 + a1) == list(range(96))
