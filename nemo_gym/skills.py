"""Agent Skills for a run: a directory of skill folders, each with a ``SKILL.md``, and its provenance stamp.

A skill is a folder whose ``SKILL.md`` opens with YAML frontmatter (``name``, ``description``, and
``metadata.version``) between ``---`` lines, as the Agent Skills standard of Codex CLI and Claude Code
has it. ``load_skill_directory`` gives the ``SkillsRef`` stamped on each rollout: the path, the
skills, and a hash of the directory's files, so a skill edited in place is still told apart.
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path
from typing import Optional

import yaml
from pydantic import BaseModel

from nemo_gym.config.paths import search_roots

SKILL_MD_FILENAME = "SKILL.md"
HASH_LENGTH = 12


class SkillMetadata(BaseModel):
    name: str
    description: Optional[str] = None
    version: Optional[str] = None


class SkillsRef(BaseModel):
    path: str
    hash: str
    skills: list[SkillMetadata]


class SkillsConfig(BaseModel):
    # A directory of skill directories.
    path: str


def find_skills_dir(path: str) -> Path:
    """An absolute path, or one under the working directory, as given; else under the first search root that has it."""
    given = Path(path)
    if given.is_absolute() or given.exists():
        return given
    return next((root / given for root in search_roots() if (root / given).exists()), given)


def hash_skill_dir(root: Path) -> str:
    """A short sha256 of every file's relative path and bytes, in path order."""
    digest = hashlib.sha256()
    for file in sorted(path for path in root.rglob("*") if path.is_file()):
        digest.update(file.relative_to(root).as_posix().encode() + b"\0" + file.read_bytes() + b"\0")
    return digest.hexdigest()[:HASH_LENGTH]


def parse_skill_md(skill_md_path: Path) -> SkillMetadata:
    """The metadata in a ``SKILL.md``'s frontmatter; a ``ValueError`` saying what is wrong with a bad one."""
    lines = skill_md_path.read_text(encoding="utf-8-sig", errors="replace").splitlines()
    if not lines or lines[0].strip() != "---":
        raise ValueError(f"{skill_md_path} is missing YAML frontmatter: it must start with a '---' line, then 'name:' and 'description:'")
    closing = next((index for index in range(1, len(lines)) if lines[index].strip() == "---"), None)
    if closing is None:
        raise ValueError(f"{skill_md_path}: the YAML frontmatter is unterminated (no closing '---' line)")
    try:
        data = yaml.safe_load("\n".join(lines[1:closing])) or {}
    except yaml.YAMLError as error:
        raise ValueError(f"{skill_md_path} has malformed YAML frontmatter: {error}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{skill_md_path}: the frontmatter must be a YAML mapping, not {type(data).__name__}")
    if not data.get("name"):
        raise ValueError(f"{skill_md_path}: the frontmatter has no 'name'")
    metadata = data.get("metadata")
    version = metadata.get("version") if isinstance(metadata, dict) else None
    return SkillMetadata(name=str(data["name"]), description=data.get("description"), version=None if version is None else str(version))


def load_skill_directory(path: str) -> SkillsRef:
    """Every skill under ``path`` (one folder each, in name order), with the directory's hash."""
    directory = find_skills_dir(path)
    if not directory.exists():
        raise ValueError(f"skills path {directory} does not exist (skills.path={path!r})")
    if not directory.is_dir():
        raise ValueError(f"skills path {directory} is a file; it must be a directory of skill directories (skills.path={path!r})")
    skills = []
    for skill_dir in sorted(child for child in directory.iterdir() if child.is_dir()):
        if not (skill_dir / SKILL_MD_FILENAME).is_file():
            raise ValueError(f"skill directory {skill_dir} is missing a {SKILL_MD_FILENAME}")
        skills.append(parse_skill_md(skill_dir / SKILL_MD_FILENAME))
    if not skills:
        raise ValueError(f"skills path {directory} contains no skills: each skill is a folder with a {SKILL_MD_FILENAME} (skills.path={path!r})")
    return SkillsRef(path=path, hash=hash_skill_dir(directory), skills=skills)


def stage_skills(path: str, dest_skills_dir: Path) -> None:
    """Copy the skills directory to ``dest_skills_dir`` (which must not exist yet), where an agent looks for skills."""
    directory = find_skills_dir(path)
    if not directory.is_dir():
        raise ValueError(f"cannot stage skills: {directory} is not a directory (skills path {path!r}); it must be reachable from the agent")
    shutil.copytree(directory, dest_skills_dir)
