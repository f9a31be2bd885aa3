"""The tuner's errors: raised by gpufleet.tune, gpufleet.kv_memory and gpufleet.kv_log.

The vllm_tune module turns them into its failure message (a NoFitError also carries the
nearest settings that would fit); gpufleet.tune names them in its __all__, the entry
point its callers import them from.
"""
from __future__ import annotations


class TuneError(ValueError):
    """Bad input to the planner: says what was wrong and what to do."""


class NoFitError(TuneError):
    """Nothing fits; carries the nearest settings that would."""

    def __init__(self, message, nearest, result):
        super().__init__(message)
        self.nearest = nearest
        self.result = result
