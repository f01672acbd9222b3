"""The base of every configuration section: unknown keys are errors, defaults are validated."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class ConfigSection(BaseModel):
    """A section of ``cdc.yaml``: its keys are checked, its defaults validated."""

    # coerce_numbers_to_str: the Go tool's template has `tlsMinVersion: 1.3`, which YAML reads as
    # a number; a drop-in configuration must load as it is.
    model_config = ConfigDict(extra="forbid", validate_default=True, coerce_numbers_to_str=True)
