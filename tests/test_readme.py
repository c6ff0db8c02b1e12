"""What a newcomer reads first: a README that fits on a few screens, whose numbers are its reports', whose
links lead somewhere, and docs whose layout names every module there is."""

import importlib.util
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
_spec = importlib.util.spec_from_file_location("readme_results", ROOT / "scripts" / "readme_results.py")
readme_results = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(readme_results)


def test_the_readme_reads_in_five_minutes():
    assert len(README.splitlines()) <= 200


def test_its_numbers_are_the_reports():
    begin, end = readme_results.SUMMARY
    block = README.split(begin, 1)[1].split(end, 1)[0]
    assert block.strip() == readme_results.render_summary().strip()
    # every number of the README sits in that block (or is a command's argument, a size, a count)
    outside = README.replace(block, "")
    assert not re.search(r"\d+\.\d+ \[", outside), "an interval outside the generated block"


def test_no_interval_in_the_docs_is_typed_by_hand():
    """An interval (a measured number) in docs/ sits in a block the generator writes, never in prose."""
    begin, end = readme_results.BEGIN, readme_results.END
    for page in (ROOT / "docs").glob("*.md"):
        text = page.read_text()
        if begin in text:
            text = text.split(begin, 1)[0] + text.split(end, 1)[1]
        assert not re.findall(r"\d+\.\d+ \[[-+]?\d", text), page.name


def test_the_check_fails_when_a_number_is_typed_by_hand(tmp_path, monkeypatch):
    begin, end = readme_results.SUMMARY
    block = README.split(begin, 1)[1].split(end, 1)[0]
    edited = README.replace(block, block.replace("[", "[1", 1))
    assert edited != README
    fake = tmp_path / "README.md"
    fake.write_text(edited)
    regenerated = readme_results._replace(fake, readme_results.SUMMARY, readme_results.render_summary())
    assert regenerated != edited and regenerated == README


def test_every_page_and_file_it_names_exists_and_every_doc_is_linked():
    named = set(re.findall(r"\b(docs/[\w-]+\.md|reports/[\w/.-]+\.(?:md|png|json))", README))
    assert named and all((ROOT / p).exists() for p in named), sorted(p for p in named if not (ROOT / p).exists())
    docs = {f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md")}
    assert docs <= named, sorted(docs - named)


def test_the_layout_names_every_module():
    layout = (ROOT / "docs" / "pipeline.md").read_text().split("## Layout", 1)[1]
    words = set(re.findall(r"[\w]+", layout))
    modules = {p.stem for p in (ROOT / "src" / "speccap").rglob("*.py") if p.stem != "__init__"}
    flows = {p.stem for p in (ROOT / "flows").glob("*.py") if p.stem != "__init__"}
    scripts = {p.stem for p in (ROOT / "scripts").glob("*.py")}
    missing = sorted((modules | scripts) - words) + sorted(f for f in flows - words if f in
                                                           ("pipeline", "sweep_hooks", "cluster", "deploy"))
    assert not missing, f"docs/pipeline.md's layout does not name {missing}"
