"""The wheel carries every data file the package reads at run time.

A wheel built without ``topics/topics.toml`` once installed cleanly and then
died on the first command; an editable install never shows it. This builds the
wheel the way compose/Dockerfile and .ci/wheel-smoke do (``pip wheel --no-deps``)
from a clean copy of the sources, and lists what it holds.
"""

from __future__ import annotations

import email
import zipfile

import pytest

import processor
from processor.facts.codec import SCHEMA_DIR
from processor.facts.models import FACT_TYPES, MESSAGE_TYPES
from tests.wheel_support import REPO_ROOT, build_wheel

pytestmark = pytest.mark.slow  # pip builds in an isolated environment: 5 s or more


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> zipfile.ZipFile:
    return zipfile.ZipFile(build_wheel(tmp_path_factory.mktemp("wheel")))


def test_the_wheel_holds_a_schema_for_every_model(wheel: zipfile.ZipFile) -> None:
    names = set(wheel.namelist())
    missing = [
        model.__name__
        for model in (*FACT_TYPES, *MESSAGE_TYPES)
        if f"processor/schemas/{model.__name__}.avsc" not in names
    ]
    assert missing == []


def test_the_wheel_holds_every_kept_old_schema(wheel: zipfile.ZipFile) -> None:
    kept = sorted((SCHEMA_DIR / "history").glob("*.avsc"))
    assert kept, "no old schemas in the checkout: nothing to check"
    names = set(wheel.namelist())
    assert [p.name for p in kept if f"processor/schemas/history/{p.name}" not in names] == []


def test_the_wheel_holds_the_topics_and_the_type_marker(wheel: zipfile.ZipFile) -> None:
    names = set(wheel.namelist())
    assert "processor/topics/topics.toml" in names
    assert "processor/py.typed" in names
    declared = (REPO_ROOT / "topics" / "topics.toml").read_bytes()
    assert wheel.read("processor/topics/topics.toml") == declared


def test_the_wheel_holds_the_inspector_page(wheel: zipfile.ZipFile) -> None:
    static = REPO_ROOT / "processor" / "web" / "static"
    files = sorted(p.name for p in static.iterdir() if p.is_file())
    assert {"index.html", "app.js", "style.css"} <= set(files)
    for name in files:
        assert wheel.read(f"processor/web/static/{name}") == (static / name).read_bytes()


def test_the_wheel_declares_the_package_version_and_license(wheel: zipfile.ZipFile) -> None:
    (meta_name,) = [n for n in wheel.namelist() if n.endswith(".dist-info/METADATA")]
    metadata = email.message_from_bytes(wheel.read(meta_name))
    assert metadata["Version"] == processor.__version__
    assert metadata["License-Expression"] == "Apache-2.0"
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in wheel.namelist())


def test_the_wheel_requires_the_files_of_its_docs_page(wheel: zipfile.ZipFile) -> None:
    """/docs serves Swagger UI's files from a dependency, not from the wheel."""
    (meta_name,) = [n for n in wheel.namelist() if n.endswith(".dist-info/METADATA")]
    metadata = email.message_from_bytes(wheel.read(meta_name))
    required = [r.split(">")[0].split("<")[0].strip() for r in metadata.get_all("Requires-Dist")]
    assert "swagger-ui-bundle-v2" in required
