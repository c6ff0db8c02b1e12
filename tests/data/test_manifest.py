import pytest

from speccap.data.manifest import ManifestError, append_jsonl, read_jsonl, read_manifest, write_jsonl


def _rec(**kw):
    rec = {"id": "a", "path": "a.wav", "duration": 1.0, "split": "test", "language": "en",
           "references": ["In the audio, calm. Therefore, neutral."]}
    rec.update(kw)
    return rec


def test_roundtrip_with_unicode(tmp_path):
    recs = [_rec(references=["在音频中，语气轻快😄", "naïve café — “quoted”"])]
    write_jsonl(tmp_path / "m.jsonl", recs)
    assert read_manifest(tmp_path / "m.jsonl") == recs


@pytest.mark.parametrize("refs", [[], [""], ["   "], None])
def test_missing_or_empty_references_are_named(tmp_path, refs):
    write_jsonl(tmp_path / "m.jsonl", [_rec(), _rec(id="b", references=refs)])
    with pytest.raises(ManifestError, match=r"m.jsonl:2: clip 'b' has no non-empty reference"):
        read_manifest(tmp_path / "m.jsonl")


def test_missing_field_and_bad_json(tmp_path):
    rec = _rec()
    del rec["path"]
    write_jsonl(tmp_path / "m.jsonl", [rec])
    with pytest.raises(ManifestError, match="lacks field\\(s\\) path"):
        read_manifest(tmp_path / "m.jsonl")
    (tmp_path / "bad.jsonl").write_text('{"id": 1}\n{oops\n')
    with pytest.raises(ManifestError, match="bad.jsonl:2: not valid JSON"):
        read_jsonl(tmp_path / "bad.jsonl")


def test_journal_keeps_records_written_before_a_crash(tmp_path):
    j = tmp_path / "j.jsonl"
    append_jsonl(j, _rec(id="a"))
    append_jsonl(j, _rec(id="b"))
    with j.open("a") as fh:
        fh.write('{"id": "c", "pa')  # the process died mid-line
    assert [r["id"] for r in read_jsonl(j, tolerate_partial_last_line=True)] == ["a", "b"]
