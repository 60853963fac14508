"""nemo_gym.path_utils: where a rollout file's failed rows go."""

from pathlib import Path

from nemo_gym.path_utils import failures_path_for


def test_failures_go_beside_the_output_as_its_stem_with_failures_jsonl():
    assert failures_path_for(Path("/runs/out.jsonl")) == Path("/runs/out_failures.jsonl")
    assert failures_path_for(Path("results/r.v2.jsonl")) == Path("results/r.v2_failures.jsonl")
