"""The README's "Testing your pipelines" example runs as written (so it cannot rot)."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest

from tests.apps.support import REPO_ROOT


def _readme_tests() -> dict[str, Callable[[], None]]:
    """The test functions defined by the first python block of the README's section."""
    text = (REPO_ROOT / "README.md").read_text()
    section = text.split("\n## Testing your pipelines\n", 1)[1].split("\n## ", 1)[0]
    match = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert match, "the README's testing section has no python example"
    namespace: dict[str, Any] = {}
    exec(compile(match.group(1), "README.md:Testing your pipelines", "exec"), namespace)
    return {name: fn for name, fn in namespace.items() if name.startswith("test_")}


EXAMPLES = _readme_tests()


def test_the_readme_shows_tests() -> None:
    assert set(EXAMPLES) == {
        "test_a_paid_order_is_invoiced",
        "test_an_unpaid_order_fails_when_its_await_times_out",
    }


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_the_readme_example_passes(name: str) -> None:
    EXAMPLES[name]()
