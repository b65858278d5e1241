"""Pretraining at an S3 root resumes from the Train checkpoint in the bucket (issue #68's default-run form of the S3
resume that tests/test_cluster.py checks under -m slow with two drivers and separate caches).

A local S3 server (moto, from the dev extra) holds the root; the endpoint and credentials are in the root URI, as
pyarrow reads them, so that the session's Ray workers, started before the server, reach it with no environment of
their own. The worker crashes after step 3 (the checkpoint of step 2 is in the bucket); the restarted worker group
loads that checkpoint from the bucket and trains steps 3 and 4 only, step 3 to the weights the first life reached
there (the optimizer's state came back with the weights). A restart from scratch trains steps 1 to 4 again and
fails here."""
from __future__ import annotations

import dataclasses
import secrets
import shutil

import pytest
from fault_hooks import Chain, CrashOnce, Probe, probed_steps, registered
from local_cluster import moto_server

from alignlab.platform.presets import Preset

CFG = dataclasses.replace(Preset.named("smoke").pretrain, objectives="mlm,nsp", max_steps=4, checkpoint_every=2,
                          log_every=1, precision="fp32")


@pytest.mark.ray
@pytest.mark.cluster
@pytest.mark.timeout(600)
def test_a_worker_killed_at_an_s3_root_resumes_from_the_train_checkpoint_in_the_bucket(ray_session, smoke_corpus,
                                                                                      tmp_path):
    import boto3

    from alignlab.platform.corpus.corpus import MANIFEST, load_manifest
    from alignlab.platform.pretrain.driver import pretrain
    from alignlab.platform.pretrain.models import FINAL_MARKER
    from alignlab.platform.storage.root import resolve_root

    proc, endpoint = moto_server()
    st = None
    try:
        bucket = f"resume-{secrets.token_hex(4)}"  # and so a cache folder of its own (named by the root URI)
        s3 = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="test", aws_secret_access_key="test",
                          region_name="us-east-1")
        s3.create_bucket(Bucket=bucket)
        st = resolve_root(f"s3://test:test@{bucket}/runs?endpoint_override={endpoint.split('://')[1]}&scheme=http"
                          "&region=us-east-1")
        # The session's smoke corpus, published at the root as a build there leaves it (its manifest last).
        cid = load_manifest(smoke_corpus)["corpus_id"]
        shutil.copytree(smoke_corpus, st.here(st.corpus(cid)))
        st.push(st.corpus(cid), last=(MANIFEST,))

        probe = tmp_path / "probe"
        probe.mkdir()
        mdir = pretrain(st.here(st.corpus(cid)), CFG, st, after_step=registered(Chain(Probe(str(probe)),
                                                                                       CrashOnce(step=3))))
        assert (mdir / ".crashed-once").exists()  # the crash happened, and the run went on
        records = probed_steps(probe, 0)
        assert [r["step"] for r in records] == [1, 2, 3, 3, 4], [r["step"] for r in records]
        assert records[3]["digest"] == records[2]["digest"], "step 3 again did not reach step 3's weights"
        keys = [o["Key"] for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix="runs/models/")
                for o in page.get("Contents", [])]
        assert any("/ray/train/checkpoint_" in k and k.endswith("/state.pt") for k in keys), keys
        assert f"runs/models/{mdir.name}/final/{FINAL_MARKER}" in keys
    finally:
        proc.kill()
        proc.wait()
        if st is not None:
            shutil.rmtree(st.local, ignore_errors=True)
