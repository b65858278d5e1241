"""The command-line flags that `alignlab` (cli.py) and the study scripts (study.run.study_main,
studies/objective_mix.py) share, each defined once: its name, its choices (the constant the config validates it
against) and its help. A parser calls `add_<flag>_flag(parser)`; what differs between parsers (the default of
`--precision`, the words of a help) is an argument, never a second spelling of the flag.
"""
from __future__ import annotations

from alignlab.platform.config import PRECISIONS, PRESETS
from alignlab.platform.runtime.errors import positive_int

STORAGE_HELP = ("storage root: a local path, file:// URI, or a remote URI such as s3://bucket/prefix "
                "(default ./alignlab-storage)")


def add_preset_flag(parser, *, default: str = "mini") -> None:
    parser.add_argument("--preset", default=default, choices=PRESETS,
                        help=f"{' | '.join(PRESETS)} (default {default})")


def add_storage_flag(parser, help: str = STORAGE_HELP) -> None:
    parser.add_argument("--storage", default=None, help=help)


def add_debug_flag(parser) -> None:
    parser.add_argument("--debug", action="store_true",
                        help="show the traceback of an error (or set ALIGNLAB_DEBUG=1)")


def add_precision_flag(parser, *, default: str | None = "auto", help: str) -> None:
    """`--precision auto|fp32|bf16` (`PretrainConfig.precision`); `default` None: the preset's."""
    parser.add_argument("--precision", choices=PRECISIONS, default=default, help=help)


def add_max_concurrent_flag(parser, *, default: int | None, help: str) -> None:
    """`--max-concurrent N` (N >= 1): at most N trials at once."""
    parser.add_argument("--max-concurrent", type=positive_int, default=default, help=help)


def add_optuna_storage_flag(parser, help: str) -> None:
    from alignlab.platform.storage.optuna_place import rdb_url

    parser.add_argument("--optuna-storage", default=None, metavar="URL", type=rdb_url, help=help)
