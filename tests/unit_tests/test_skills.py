"""nemo_gym.skills: a directory of Agent Skills (each a folder with a SKILL.md), its metadata and content hash."""

from __future__ import annotations

from pathlib import Path

import pytest

from nemo_gym.skills import SkillsConfig, SkillsRef, hash_skill_dir, load_skill_directory, parse_skill_md, stage_skills


def skill(root: Path, name: str, frontmatter: str = "", body: str = "Do it.") -> Path:
    directory = root / name
    directory.mkdir(parents=True)
    (directory / "SKILL.md").write_text(f"---\nname: {name}\n{frontmatter}---\n{body}\n")
    return directory


def test_a_skill_md_frontmatter_gives_name_description_and_the_version_under_metadata(tmp_path):
    path = skill(tmp_path, "lookup", "description: Look things up\nmetadata:\n  version: 1.0\n") / "SKILL.md"
    metadata = parse_skill_md(path)
    assert (metadata.name, metadata.description, metadata.version) == ("lookup", "Look things up", "1.0")
    path.write_bytes("\ufeff".encode() + path.read_bytes())
    assert parse_skill_md(path).name == "lookup"  # a byte order mark is tolerated


@pytest.mark.parametrize(
    ("text", "complaint"),
    [
        ("name: x\n", "missing YAML frontmatter"),
        ("---\nname: x\n", "unterminated"),
        ("---\nname: [x\n---\n", "malformed YAML"),
        ("---\n- x\n---\n", "must be a YAML mapping"),
        ("---\ndescription: d\n---\n", "'name'"),
    ],
)
def test_a_bad_skill_md_is_a_value_error_saying_what_is_wrong(tmp_path, text, complaint):
    path = tmp_path / "SKILL.md"
    path.write_text(text)
    with pytest.raises(ValueError, match=complaint):
        parse_skill_md(path)


def test_a_skills_directory_loads_every_skill_in_name_order_with_its_content_hash(tmp_path):
    skill(tmp_path, "b")
    skill(tmp_path, "a")
    ref = load_skill_directory(str(tmp_path))
    assert isinstance(ref, SkillsRef)
    assert (ref.path, [s.name for s in ref.skills]) == (str(tmp_path), ["a", "b"])
    assert ref.hash == hash_skill_dir(tmp_path) and len(ref.hash) == 12


def test_the_hash_changes_with_a_files_bytes_or_its_name_and_not_otherwise(tmp_path):
    directory = skill(tmp_path, "a")
    before = hash_skill_dir(tmp_path)
    assert hash_skill_dir(tmp_path) == before
    (directory / "SKILL.md").write_text((directory / "SKILL.md").read_text() + "more\n")
    edited = hash_skill_dir(tmp_path)
    assert edited != before
    (directory / "SKILL.md").rename(directory / "OTHER.md")
    assert hash_skill_dir(tmp_path) != edited


def test_a_skills_path_that_is_missing_a_file_empty_or_has_a_folder_without_skill_md_is_refused(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        load_skill_directory(str(tmp_path / "nowhere"))
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match="is a file"):
        load_skill_directory(str(tmp_path / "file"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="contains no skills"):
        load_skill_directory(str(tmp_path / "empty"))
    (tmp_path / "empty" / "loose").mkdir()
    with pytest.raises(ValueError, match="missing a SKILL.md"):
        load_skill_directory(str(tmp_path / "empty"))


def test_a_relative_skills_path_is_found_under_the_working_directory(tmp_path, monkeypatch):
    skill(tmp_path / "skills", "a")
    monkeypatch.chdir(tmp_path)
    assert load_skill_directory("skills").skills[0].name == "a"


def test_stage_skills_copies_the_directory_to_a_new_place_and_refuses_what_is_not_one(tmp_path):
    skill(tmp_path / "skills", "a")
    stage_skills(str(tmp_path / "skills"), tmp_path / "agent" / "skills")
    assert (tmp_path / "agent" / "skills" / "a" / "SKILL.md").is_file()
    with pytest.raises(FileExistsError):
        stage_skills(str(tmp_path / "skills"), tmp_path / "agent" / "skills")
    with pytest.raises(ValueError, match="not a directory"):
        stage_skills(str(tmp_path / "nowhere"), tmp_path / "other")
    assert SkillsConfig(path="skills").path == "skills"
