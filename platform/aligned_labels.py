"""Dissolved: the labels moved to their objectives, the text rules to `alignlab.platform.text`.

TODO(#16 merge): remove. Kept only for the modules not yet re-pointed: platform/finetune.py and
platform/inference.py import `WHP_TAGS` (now `alignlab.objectives.hyperlink.TAGS`), platform/tasks.py imports
`mutation_kernel` (now `alignlab.platform.text.mutation_kernel`).
"""
from alignlab.objectives.hyperlink import TAGS as WHP_TAGS  # noqa: F401
from alignlab.platform.text import mutation_kernel  # noqa: F401
