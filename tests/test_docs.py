"""The documentation against the code: the README stays a front door (small, with CI's exact commands),
docs/configuration.md documents every config key with its built-in default, and no relative link is broken."""
from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import pytest

from ingest.config import DEFAULTS, load_config

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
README_MAX_BYTES = 8192


def _ci_commands() -> list[str]:
    """The two commands .ci/run executes: the install line, and the test line without CI's `|| rc=$?`."""
    lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()]
    install = [line for line in lines if line.startswith("python3 -m venv .venv")]
    tests = [line.split(" || ")[0] for line in lines if "python -m pytest" in line and not line.startswith("#")]
    assert len(install) == 1 and len(tests) == 1, "expected one install line and one pytest line in .ci/run"
    return [install[0], tests[0]]


def test_readme_is_a_front_door() -> None:
    size = len(README.read_bytes())
    assert size <= README_MAX_BYTES, f"README.md is {size} bytes, over {README_MAX_BYTES}: move detail to docs/"


def test_readme_has_the_commands_ci_runs() -> None:
    lines = README.read_text(encoding="utf-8").splitlines()
    install, tests = _ci_commands()
    assert install.endswith("&& ingest run samples/")
    for command in (install, tests):
        assert command in lines, f"README.md lacks, as a line of its own, the command .ci/run executes: {command}"


# -- docs/configuration.md against ingest.config.DEFAULTS ---------------------------------------------
def _flat(table: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in table.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _cells(row: str) -> list[str]:
    return [cell.strip() for cell in re.split(r"(?<!\\)\|", row.strip().strip("|"))]


def _documented() -> dict[str, str]:
    """{"section.key": the default's TOML literal} from every `## [section]` table of docs/configuration.md."""
    text = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    section, out = None, {}
    for line in text.splitlines():
        if heading := re.match(r"#{2,6} \[([\w.]+)\]\s*$", line):
            section = heading.group(1)
        elif line.startswith("#"):
            section = None
        elif section and line.startswith("|"):
            cells = _cells(line)
            if cells[0] == "key" or set(cells[0]) <= set("-: "):
                continue                                  # the header and its rule
            key, default = (re.fullmatch(r"`([^`]+)`", cell) for cell in cells[:2])
            assert key and default, f"docs/configuration.md [{section}]: write key and default in backticks: {line}"
            dotted = f"{section}.{key.group(1)}"
            assert dotted not in out, f"docs/configuration.md documents {dotted} twice"
            out[dotted] = default.group(1)
    return out


def test_configuration_documents_every_key_with_its_default() -> None:
    builtin, documented = _flat(DEFAULTS), _documented()
    assert sorted(set(builtin) - set(documented)) == [], "keys missing from docs/configuration.md"
    assert sorted(set(documented) - set(builtin)) == [], "docs/configuration.md documents keys that do not exist"
    wrong = {}
    for key, literal in documented.items():
        value = tomllib.loads(f"x = {literal}")["x"]
        if type(value) is not type(builtin[key]) or value != builtin[key]:
            wrong[key] = f"documented {literal}, built-in {builtin[key]!r}"
    assert wrong == {}


def test_example_config_shows_the_defaults() -> None:
    """config.toml says "a missing key takes the default shown here": loading it changes nothing."""
    assert load_config(ROOT / "config.toml") == load_config(None)


# -- links ----------------------------------------------------------------------------------------------
def _without_code(text: str) -> str:
    text = re.sub(r"(?ms)^(```|~~~).*?^\1[^\n]*$", "", text)      # fenced blocks
    return re.sub(r"`[^`\n]*`", "", text)                          # inline code


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip()).replace("`", "")    # a link: its text
    return re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    text = re.sub(r"(?ms)^(```|~~~).*?^\1[^\n]*$", "", path.read_text(encoding="utf-8"))
    seen: dict[str, int] = {}
    out = set()
    for heading in re.findall(r"(?m)^#{1,6} (.+?)\s*#*\s*$", text):
        slug = _slug(heading)
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


@pytest.mark.parametrize("page", [README, *DOCS], ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page: Path) -> None:
    broken = []
    for target in re.findall(r"\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)", _without_code(page.read_text(encoding="utf-8"))):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):          # http:, https:, mailto:
            continue
        file, _, anchor = target.partition("#")
        dest = (page.parent / file).resolve() if file else page
        if not dest.exists():
            broken.append(f"{target} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            broken.append(f"{target} (no heading #{anchor} in {dest.relative_to(ROOT)})")
    assert broken == [], f"{page.relative_to(ROOT)}: broken links"
