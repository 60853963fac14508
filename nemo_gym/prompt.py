"""Prompt templates (upstream's ``prompt_config`` YAML files): a task row's fields filled into its first messages.

A template file has ``user`` and optionally ``system``, each a ``str.format`` template of the row's top
level fields (``{question}``; ``{{`` for a literal brace). A row gets its ``responses_create_params.input``
from the template or from its data, never both: that lets one data file be tried with many prompts.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Optional

import yaml
from pydantic import BaseModel

from nemo_gym.config.files import find_file
from nemo_gym.config.paths import search_roots


class PromptConfig(BaseModel):
    user: str
    system: Optional[str] = None


def find_prompt_file(path: str) -> Path:
    """A relative path is looked up as config files are: the working directory, then the search roots."""
    return find_file(path, search_roots())


@functools.lru_cache(maxsize=64)
def load_prompt_config(path: str) -> PromptConfig:
    return PromptConfig.model_validate(yaml.safe_load(find_prompt_file(path).read_text()))


def fill_prompt(prompt_config: PromptConfig, row: dict) -> list[dict[str, str]]:
    """The system message (if the template has one) and the user message, filled from ``row``.

    A placeholder the row lacks is a ``KeyError`` naming it and the fields the row has.
    """
    templates = [("system", prompt_config.system), ("user", prompt_config.user)]
    try:
        return [{"role": role, "content": template.format_map(row)} for role, template in templates if template is not None]
    except KeyError as missing:
        raise KeyError(f"the prompt template uses the field {missing}, but the row has only {list(row)}") from None


def validate_prompt_compatibility(rows: list[dict], prompt_config: PromptConfig) -> None:
    """Refuse rows that already have ``responses_create_params.input``, naming every such row's index."""
    given = [index for index, row in enumerate(rows) if (row.get("responses_create_params") or {}).get("input")]
    if given:
        raise ValueError(f"rows {given} have responses_create_params.input and a prompt_config is given too: use one or the other")


def apply_prompt_to_row(row: dict, prompt_config: PromptConfig) -> dict:
    """A copy of ``row`` whose ``responses_create_params.input`` is the filled template; its other parameters are kept."""
    params = row.get("responses_create_params")
    params = dict(params) if isinstance(params, dict) else {}
    return {**row, "responses_create_params": {**params, "input": fill_prompt(prompt_config, row)}}


def materialize_prompts(input_jsonl: str, prompt_config: str, output_jsonl: str) -> None:
    """Write ``input_jsonl``'s rows to ``output_jsonl`` with the template applied and ``prompt_config_used`` set."""
    template = load_prompt_config(prompt_config)
    used = str(find_prompt_file(prompt_config))
    with open(input_jsonl) as file:
        rows = [json.loads(line) for line in file if line.strip()]
    validate_prompt_compatibility(rows, template)
    output = Path(output_jsonl)
    output.parent.mkdir(parents=True, exist_ok=True)
    with output.open("w") as file:
        for row in rows:
            file.write(json.dumps({**apply_prompt_to_row(row, template), "prompt_config_used": used}) + "\n")
