"""The domain phase's two checks on the corpus (`PretrainConfig.domain_sources`): that the sources it names are in
the corpus beside others, and which rows of a batch belong to them. No Ray here: the Ray Data pipeline in
`pretrain.driver` maps `rows_of_sources` over its batches."""
from __future__ import annotations

from alignlab.platform.config import PretrainConfig

# The corpus module (pyarrow) is imported inside `check_domain_sources`, the one function that reads a
# manifest: the phase's row mixing, which runs on every rank, does not need it.


def check_domain_sources(cfg: PretrainConfig, manifest: dict) -> None:
    """A domain phase needs rows of its sources and of others in the corpus (`PretrainConfig.domain_sources`)."""
    if not cfg.domain_sources:
        return
    from alignlab.platform.corpus.corpus import corpus_sources

    have, where = corpus_sources(manifest), f"corpus {manifest.get('corpus_id')}"
    if have is None:
        raise ValueError(f"PretrainConfig.domain_sources {'+'.join(cfg.domain_sources)}: {where} records no documents "
                         "per source (built before they were counted); rebuild it with `alignlab corpus build`")
    if missing := [n for n in cfg.domain_sources if n not in have]:
        raise ValueError(f"PretrainConfig.domain_sources names {', '.join(missing)}, which {where} has no documents of "
                         f"(it has {', '.join(sorted(have)) or 'none'}): add the source or leave the domain phase off")
    if not have - set(cfg.domain_sources):
        raise ValueError(f"PretrainConfig.domain_sources {'+'.join(cfg.domain_sources)} are all of {where}'s sources: "
                         "the steps before the domain phase would have no rows")


def rows_of_sources(batch, sources: tuple[str, ...], keep: bool):
    """The rows of a pyarrow batch whose doc_id's source prefix ("software:...") is (`keep`) or is not in `sources`."""
    import pyarrow as pa
    import pyarrow.compute as pc

    source = pc.list_element(pc.split_pattern(batch["doc_id"], ":", max_splits=1), 0)
    hit = pc.is_in(source, value_set=pa.array(list(sources), type=pa.string()))
    return batch.filter(hit if keep else pc.invert(hit))
