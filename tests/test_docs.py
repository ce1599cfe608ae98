"""The README is a front door and docs/ holds the rest: the README stays short, every link between the pages
leads somewhere (the configuration reference is checked beside conf/broker.conf, tests/broker/test_config.py)."""
from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
PAGES = [README, *sorted((REPO / "docs").glob("*.md"))]
README_MAX_LINES = 250


def test_the_readme_is_a_front_door():
    lines = README.read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines: move detail to docs/"
    setup = [line for line in lines if line.startswith("bash scripts/")]
    assert setup == ["bash scripts/start_broker.sh", "bash scripts/test.sh"], setup


def test_every_link_between_pages_leads_to_a_file():
    broken = []
    for page in PAGES:
        text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)  # code blocks hold no links
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+://|#|mailto:", target):
                continue
            path = (page.parent / target.split("#")[0]).resolve()
            if not path.exists():
                broken.append(f"{page.relative_to(REPO)}: {target}")
    assert not broken, "links to nothing:\n" + "\n".join(broken)


def test_no_command_shown_needs_an_activated_venv():
    """A new user's shell has no ``halfmq`` on its PATH: commands in code blocks say ``.venv/bin/halfmq`` (inside
    a container, ``docker exec NAME halfmq ...`` is the image's own)."""
    bare = []
    for page in PAGES:
        for block in re.findall(r"```(?:bash|sh|text)\n(.*?)```", page.read_text(), flags=re.S):
            for line in block.splitlines():
                if re.match(r"\s*halfmq\s+(admin|broker|namesrv|dashboard|cluster)\b(?!\s+ready:)", line):
                    bare.append(f"{page.relative_to(REPO)}: {line.strip()}")
    assert not bare, "bare halfmq commands:\n" + "\n".join(bare)
