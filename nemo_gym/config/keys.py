"""The keys a config model takes: a key it does not declare loads with a warning naming it (upstream
ignores such keys, and its configs and tests carry them), but a near miss of a key the model declares
is a typo, refused naming the key it resembles, so that no setting silently keeps its default."""

from __future__ import annotations

import difflib
import logging
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError

# difflib's similarity ratio from which an unknown key may be a misspelling of a declared one (num_worker,
# max_body_byte, verifed, timeout_secs), and from which its words that differ are misspelt words.
NEAR_MISS_CUTOFF = 0.8
WORD_CUTOFF = 0.6
logger = logging.getLogger("nemo_gym.config")


def misspells(key: str, declared: str) -> bool:
    """Whether ``key`` is ``declared`` with words misspelt, not with whole words added, dropped or replaced:
    ``judge_prompt_template`` is a key of its own next to ``judge_prompt_template_fpath``, and so is
    ``judge_timeout_seconds`` next to ``body_timeout_seconds`` (upstream's configs carry both)."""
    key_words, declared_words = key.split("_"), declared.split("_")
    changed = [word for word in key_words if word not in declared_words]
    replaced = [word for word in declared_words if word not in key_words]
    return bool(changed and replaced) and all(difflib.get_close_matches(word, replaced, n=1, cutoff=WORD_CUTOFF) for word in changed)


def near_miss(key: str, known: list[str]) -> str | None:
    """The declared key that ``key`` misspells, if any."""
    close = difflib.get_close_matches(key, known, n=len(known), cutoff=NEAR_MISS_CUTOFF)
    return next((declared for declared in close if misspells(key, declared)), None)


def declared_keys(model: type[BaseModel]) -> list[str]:
    """The field names of a model and their aliases."""
    keys = []
    for name, field in model.model_fields.items():
        keys += [key for key in (name, field.alias, field.validation_alias) if isinstance(key, str)]
    return list(dict.fromkeys(keys))


class ConfigKeys(BaseModel):
    """A config model that ignores the keys it does not declare, with a warning, and refuses near misses."""

    model_config = ConfigDict(extra="ignore")

    @model_validator(mode="before")
    @classmethod
    def _check_unknown_keys(cls, data: Any) -> Any:
        extra = cls.model_config.get("extra")
        if not isinstance(data, dict) or extra == "allow":
            return data
        known = declared_keys(cls)
        unknown = [key for key in data if isinstance(key, str) and key not in known]
        near_misses = {key: near_miss(key, known) for key in unknown}
        errors = [
            InitErrorDetails(
                type=PydanticCustomError("near_miss", "not a key of {model}; did you mean '{meant}'?", {"model": cls.__name__, "meant": meant}),
                loc=(key,),
                input=data[key],
            )
            for key, meant in near_misses.items()
            if meant
        ]
        if errors:
            raise ValidationError.from_exception_data(cls.__name__, errors)
        if unknown and extra != "forbid":
            name = data.get("name") if "name" in cls.model_fields else None
            which = f"{cls.__name__} {name!r}" if isinstance(name, str) and name else cls.__name__
            keys = ", ".join(repr(key) for key in unknown)
            logger.warning("%s: ignoring keys it does not declare (as upstream does): %s", which, keys)
        return data
