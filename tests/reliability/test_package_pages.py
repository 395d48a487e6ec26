"""What a package index shows for each package: every wheel's METADATA has the project URLs,
its README (the page) links only absolutely, and every link into the repository names a file,
directory or heading that exists here. The wheels are built for real (``uv build``)."""

from __future__ import annotations

import email
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from .conftest import REPO, load_script

PACKAGES = ("core", "adapter-celery", "adapter-dramatiq", "adapter-langgraph",
            "backend-postgres")
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _homepage(metadata: email.message.Message) -> str:
    urls = dict(v.split(", ", 1) for v in metadata.get_all("Project-URL") or [])
    return urls["Homepage"]


def _anchors(markdown: str) -> set[str]:
    """GitHub's anchors of a Markdown file's headings."""
    found = set()
    for heading in re.findall(r"^#+ (.+)$", markdown, re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        found.add(slug)
    return found


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    # scripts/dev.py names the uv it installed (./.tools/bin/uv when uv is not on PATH).
    uv = os.environ.get("TSG_UV") or shutil.which("uv")
    assert uv, "uv builds the wheels (scripts/dev.py installs it and sets TSG_UV)"
    out = tmp_path_factory.mktemp("wheels")
    built = {}
    for package in PACKAGES:
        before = set(out.glob("*.whl"))
        subprocess.run([uv, "build", "--quiet", "--wheel", "--out-dir", str(out),
                        str(REPO / "packages" / package)], check=True, timeout=600)
        (wheel,) = set(out.glob("*.whl")) - before
        built[package] = wheel
    return built


def test_every_wheel_has_project_urls_and_absolute_links(wheels: dict[str, Path]) -> None:
    build = load_script("build_release")
    homepages = set()
    for package, wheel in wheels.items():
        text = build.wheel_metadata(wheel)
        assert build.page_problems(text) == [], package
        assert build.inspect_artifact(wheel) == [], package
        metadata = email.message_from_string(text)
        urls = dict(v.split(", ", 1) for v in metadata.get_all("Project-URL") or [])
        homepage = _homepage(metadata)
        homepages.add(homepage)
        assert urls == {
            "Homepage": homepage,
            "Documentation": f"{homepage}/blob/main/packages/{package}/README.md",
            "Source": f"{homepage}/tree/main/packages/{package}",
            "Changelog": f"{homepage}/blob/main/CHANGELOG.md",
            "Issues": f"{homepage}/issues",
        }, package
        # the page is the package's own README, shipped whole
        page = metadata.get_payload()
        assert page.strip() == (REPO / "packages" / package / "README.md").read_text().strip()
    assert len(homepages) == 1  # one project, one home


def test_links_into_the_repository_resolve(wheels: dict[str, Path]) -> None:
    build = load_script("build_release")
    checked = 0
    for package, wheel in wheels.items():
        metadata = email.message_from_string(build.wheel_metadata(wheel))
        homepage = _homepage(metadata)
        for target in LINK.findall(metadata.get_payload()):
            assert target.startswith(("https://", "#")), (package, target)
            if target.startswith("#"):
                readme = (REPO / "packages" / package / "README.md").read_text()
                assert target[1:] in _anchors(readme), (package, target)
                continue
            if not target.startswith(homepage + "/"):
                continue  # another project's page
            kind, _, rest = target[len(homepage) + 1:].partition("/main/")
            path, _, anchor = rest.partition("#")
            assert kind in ("blob", "tree"), (package, target)
            local = REPO / path
            assert local.is_file() if kind == "blob" else local.is_dir(), (package, target)
            if anchor:
                assert anchor in _anchors(local.read_text()), (package, target)
            checked += 1
    assert checked >= 15


def test_a_relative_link_or_missing_url_is_a_problem() -> None:
    build = load_script("build_release")
    good = ("Metadata-Version: 2.4\nName: x\n"
            + "".join(f"Project-URL: {label}, https://example.invalid/{label}\n"
                      for label in build.PROJECT_URLS)
            + "\n[home](https://example.invalid/) [here](#here)\n")
    assert build.page_problems(good) == []
    assert build.page_problems(good.replace("(#here)", "(../core/README.md)")) == [
        "README has a relative link"]
    assert build.page_problems(good.replace("Project-URL: Issues", "X-Issues")) == [
        "metadata lacks the project URLs"]
