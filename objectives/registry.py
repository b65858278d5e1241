"""Moved to `alignlab.platform.registry`; this alias stays only until the last importers are re-pointed.

TODO(#16 merge): remove. platform/protocol.py finds the objectives folder through this module's spec
(`find_spec("alignlab.objectives.registry")`), and helper C's platform/task.py imports `registered` from here.
"""
from alignlab.platform.registry import *  # noqa: F401,F403
from alignlab.platform.registry import registered  # noqa: F401
