"""The README is the front page and docs/ the reference: CI runs the README's test command with the system
packages its quick start installs, and every link between the pages lands on a file."""

import re
import shlex
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
CI_RUN = ROOT / ".ci" / "run"
DOCS = ROOT / "docs"


def quick_start() -> list[str]:
    """The command lines of the README's first bash block, comments dropped."""
    block = re.search(r"```bash\n(.*?)```", README.read_text(), re.S).group(1)
    return [line for line in block.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def test_ci_runs_exactly_the_test_command_the_readme_gives():
    words = shlex.split(next(line for line in quick_start() if "pytest" in line))
    env = [word for word in words if re.fullmatch(r"[A-Z][A-Z0-9_]*=\S*", word)]
    ci = CI_RUN.read_text().splitlines()
    assert env == [line.split()[1] for line in ci if line.startswith("export ")]
    assert shlex.split(ci[-1]) == words[len(env):]


def test_the_quick_start_installs_every_system_package_ci_installs():
    ci_packages = set(re.findall(r"missing\+=\((\S+)\)", CI_RUN.read_text()))
    install = next(line for line in quick_start() if "apt-get install" in line)
    readme_packages = {word for word in install.split("apt-get install", 1)[1].split() if not word.startswith("-")}
    assert ci_packages == {"bubblewrap", "haproxy", "iproute2", "postgresql"}
    assert readme_packages == ci_packages


def test_every_docs_page_is_listed_in_the_index_and_the_readme():
    pages = {page.name for page in DOCS.glob("*.md")} - {"index.md"}
    index_links = set(re.findall(r"\]\(([\w-]+\.md)\)", (DOCS / "index.md").read_text()))
    readme_links = {link.removeprefix("docs/") for link in re.findall(r"\]\((docs/[\w-]+\.md)\)", README.read_text())}
    assert pages == index_links
    assert pages <= readme_links


def test_every_relative_link_of_the_readme_and_docs_lands_on_a_file():
    for page in [README, *DOCS.glob("*.md")]:
        for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", page.read_text()):
            assert (page.parent / target).exists(), f"{page.relative_to(ROOT)} links to {target}, which does not exist"
