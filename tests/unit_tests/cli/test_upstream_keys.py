"""Upstream's command keys and this command line's flags are two spellings of one invocation: both parse alike."""

from __future__ import annotations

from hypothesis import given, settings, strategies as st

from nemo_gym.cli.main import build_parser
from nemo_gym.cli.upstream_keys import as_flags

# Values as a shell hands them over: any text that does not start like an option.
values = st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), min_size=1).filter(lambda text: not text.startswith("-"))


def parsed(argv: list[str]) -> dict:
    return {key: value for key, value in vars(build_parser().parse_args(argv)).items() if key != "handler"}


@settings(max_examples=60, deadline=None)
@given(glob=values, output=values, merge=st.booleans())
def test_upstreams_aggregate_keys_parse_as_the_flags_they_stand_for(glob, output, merge):
    upstream = ["eval", "aggregate", f"+input_glob={glob}", f"++output_jsonl_fpath={output}", f"+merge_shards={str(merge).lower()}"]
    flags = ["eval", "aggregate", "--input-glob", glob, "--output", output, *([] if merge else ["--no-merge-shards"])]
    assert parsed(as_flags(upstream)) == parsed(flags)


@settings(max_examples=60, deadline=None)
@given(inputs=values, rollouts=values, output=values, limit=st.integers(1, 10**6), force=st.booleans(), resume=st.booleans())
def test_upstreams_reverify_keys_parse_as_the_flags_they_stand_for(inputs, rollouts, output, limit, force, resume):
    upstream = ["eval", "reverify", f"+materialized_inputs_jsonl_fpath={inputs}", f"+rollouts_jsonl_fpath={rollouts}", f"+output_jsonl_fpath={output}",
                f"+limit={limit}", f"+force={force}", f"++resume_from_cache={resume}"]
    flags = ["eval", "reverify", "--inputs", inputs, "--rollouts", rollouts, "--output", output, "--limit", str(limit),
             *(["--force"] if force else []), *(["--resume"] if resume else [])]
    assert parsed(as_flags(upstream)) == parsed(flags)


def test_a_key_the_command_does_not_take_stays_a_config_override():
    args = build_parser().parse_args(as_flags(["eval", "prepare", "+prepare_script_args.rows=3", "+use_cached_prepared_benchmarks=true"]))
    assert (args.overrides, args.use_cached) == (["+prepare_script_args.rows=3"], True)
