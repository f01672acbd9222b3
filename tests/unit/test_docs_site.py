"""The documentation site (docs/, mkdocs.yml): it builds with ``mkdocs build --strict`` (a broken
link, a broken anchor, a page missing from the nav or a nav entry without its page fails), the
fragments of docs/_incoming/ stay out of it, and README.md stays a landing page."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
README_MAX_LINES = 250


def build(site: Path, checkout: Path = REPO) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=checkout,
        capture_output=True,
        text=True,
        timeout=120,
        env={"NO_MKDOCS_2_WARNING": "1", "PATH": "/usr/bin:/bin"},
        check=False,
    )


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    built = build(out)
    assert built.returncode == 0, built.stdout + built.stderr
    return out


def test_the_site_builds_strict_with_every_page(site: Path) -> None:
    for page in ("index.html", "guides/quickstart.html", "reference/configuration.html"):
        assert (site / page).is_file(), page
    assert (site / "search" / "search_index.json").is_file()


def test_the_incoming_fragments_stay_out_of_the_site(site: Path) -> None:
    config = yaml.safe_load((REPO / "mkdocs.yml").read_text())
    assert "_incoming/" in config["exclude_docs"]
    assert not (site / "_incoming").exists()
    assert "_incoming" not in str(config["nav"])


def test_a_broken_link_fails_the_build(tmp_path: Path) -> None:
    """The check above can fail: a copy of the docs with one link broken does not build."""
    copy = tmp_path / "repo"
    copy.mkdir()
    (copy / "mkdocs.yml").write_text((REPO / "mkdocs.yml").read_text())
    subprocess.run(["cp", "-r", str(REPO / "docs"), str(copy / "docs")], check=True)
    page = copy / "docs" / "guides" / "quickstart.md"
    page.write_text(page.read_text() + "\n[gone](no-such-page.md)\n")
    built = build(tmp_path / "s", copy)
    assert built.returncode != 0
    assert "no-such-page.md" in built.stdout + built.stderr


def test_the_readme_is_a_landing_page_with_the_two_commands_first() -> None:
    lines = (REPO / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, len(lines)
    first_block = lines[lines.index("```bash") + 1 : lines.index("```bash") + 3]
    assert first_block[0].startswith("bash scripts/run.sh"), first_block
    assert first_block[1].startswith("bash scripts/test.sh"), first_block
    assert lines.index("```bash") < 5
    text = "\n".join(lines)
    for heading in ("## Status", "## Architecture in 30 seconds", "## Documentation"):
        assert heading in text, heading
    # every link of the README into the site names a page that exists
    import re

    for target in re.findall(r"\]\((docs/[^)#]+)", text):
        assert (REPO / target).is_file(), target


def test_milvus_cdc_docs_builds_the_site(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from server.cli.main import main

    for name in [n for n in os.environ if n.upper().startswith("CDC_")]:
        monkeypatch.delenv(name)  # the suite's own CDC_TEST_* would be unknown settings

    assert main(["docs", "--build", str(tmp_path / "site")]) == 0
    assert (tmp_path / "site" / "index.html").is_file()
    assert f"documentation written to {tmp_path / 'site'}/index.html" in capsys.readouterr().out


def test_milvus_cdc_docs_without_a_checkout_says_what_is_missing(tmp_path: Path) -> None:
    from server.cli.client import CliError
    from server.cli.docs_site import build_site

    with pytest.raises(CliError, match=r"mkdocs\.yml is missing .*pip install -e '\.\[docs\]'"):
        build_site(tmp_path / "site", checkout=tmp_path)
    assert not (tmp_path / "site").exists()
