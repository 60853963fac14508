"""Instance keys upstream NeMo Gym configs carry for its catalog and data tooling.

Every server's config accepts them, keeps them (the head endpoint shows them) and checks their shape;
nothing here acts on them. ``domain`` is optional here: upstream refuses a resources server without one.
"""

from __future__ import annotations

from enum import Enum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class Domain(str, Enum):
    MATH = "math"
    CODING = "coding"
    AGENT = "agent"
    KNOWLEDGE = "knowledge"
    INSTRUCTION_FOLLOWING = "instruction_following"
    LONG_CONTEXT = "long_context"
    SAFETY = "safety"
    GAMES = "games"
    TRANSLATION = "translation"
    E2E = "e2e"
    RLHF = "rlhf"
    OTHER = "other"


class DatasetSource(BaseModel):
    """Where a dataset is downloaded from; the fields past ``type`` belong to that host."""

    model_config = ConfigDict(extra="allow")

    type: Literal["gitlab", "huggingface"]


class DatasetConfig(BaseModel):
    """One entry of an instance's ``datasets`` list."""

    model_config = ConfigDict(extra="forbid")

    name: str
    type: Literal["train", "validation", "example", "benchmark"]
    jsonl_fpath: str
    num_repeats: int = Field(default=1, ge=1)
    license: str | None = None
    source: DatasetSource | None = None
    gitlab_identifier: Any = None
    huggingface_identifier: Any = None
    prepare_script: str | None = None
    prompt_config: str | None = None

    @model_validator(mode="after")
    def licensed_for_training(self) -> "DatasetConfig":
        if self.type in ("train", "validation") and self.license is None:
            raise ValueError(f"dataset {self.name!r} of type {self.type} needs a license")
        return self


class CatalogSettings(BaseModel):
    domain: Domain | None = None
    verified: bool = False
    verified_url: str | None = None
    description: str | None = None
    value: str | None = None
    datasets: list[DatasetConfig] = []
