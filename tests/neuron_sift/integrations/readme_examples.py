"""The code blocks of README.md's integration sections, so that tests run them as written."""

import re
from pathlib import Path
from typing import List

README = Path(__file__).resolve().parents[3] / "README.md"


def section(title: str) -> str:
    """The text of the level-2 section ``## {title}`` of README.md, up to the next level-2 heading."""
    text = README.read_text(encoding="utf-8")
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", text, flags=re.S | re.M)
    if match is None:
        raise AssertionError(f"README.md has no section '## {title}'")
    return match.group(1)


def python_blocks(title: str) -> List[str]:
    """The ```python blocks of a README section; there must be at least one."""
    blocks = re.findall(r"^```python\n(.*?)^```", section(title), flags=re.S | re.M)
    if not blocks:
        raise AssertionError(f"README.md section '## {title}' has no python example")
    return blocks


def example(title: str) -> str:
    """The section's complete example: its only python block."""
    blocks = python_blocks(title)
    if len(blocks) != 1:
        raise AssertionError(f"README.md section '## {title}' should hold one complete example, has {len(blocks)}")
    return blocks[0]
