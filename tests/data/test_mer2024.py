import shutil

import numpy as np
import pandas as pd
import pytest
import soundfile as sf

from speccap.data.mer2024 import Mer2024Error, audio_part_en, audio_part_zh, load_mer2024, select_reference

ZH = ("在视频中，人物皱着眉头；在音频中，说话者语速较快，音量较高，语气中带有不满；在文本中，字幕内容为“你怎么又迟到了”。"
      "因此，人物可能感到愤怒。")
EN = ("In the video, the person frowns. In the audio, the speaker talks fast with a raised voice. "
      "The tone carries dissatisfaction. In the text, the subtitle says \"You are late again\". "
      "Therefore, the person may feel angry.")


def test_audio_only_parts():
    assert audio_part_zh(ZH) == "在音频中，说话者语速较快，音量较高，语气中带有不满"
    assert audio_part_en(EN) == ("In the audio, the speaker talks fast with a raised voice. "
                                 "The tone carries dissatisfaction.")
    assert audio_part_zh("在视频中，人物微笑。") is None
    assert select_reference(EN, "en", "full") == EN
    assert select_reference("   ", "en", "full") is None


@pytest.fixture
def mer(tmp_path, tone):
    root = tmp_path / "MER2024"
    (root / "audio").mkdir(parents=True)
    rows = []
    for i in range(5):
        name = f"sample_{i:08d}"
        rows.append({"name": name, "chinese": ZH, "english": EN})
        sf.write(str(root / "audio" / f"{name}.wav"), tone(180 + 20 * i, 1.0), 16000, subtype="PCM_16")
    # one clip at 44.1 kHz stereo, one with emoji and unicode in its references
    sf.write(str(root / "audio" / "sample_00000001.wav"),
             np.stack([tone(200, 1.0, sr=44100)] * 2, axis=1), 44100, subtype="PCM_16")
    rows[2]["english"] = "In the audio, the speaker laughs 😄 — “naïve” café tone. Therefore, happy."
    rows[2]["chinese"] = "在音频中，说话者笑了😄，语气轻快"
    pd.DataFrame(rows).to_csv(root / "final-EMER-reason.csv", index=False)
    return root


def test_loads_a_valid_copy(mer, tmp_path):
    clips, skips = load_mer2024(mer, ("en", "zh"), "audio_only", tmp_path / "wav", 30.0)
    assert [c.name for c in clips] == [f"sample_{i:08d}" for i in range(5)] and skips == []
    c1 = clips[1]
    assert c1.wav_path.parent == tmp_path / "wav" and sf.info(str(c1.wav_path)).samplerate == 16000
    assert sf.info(str(c1.wav_path)).channels == 1
    assert clips[0].wav_path == mer / "audio" / "sample_00000000.wav"  # already 16 kHz mono: not copied
    assert "😄" in clips[2].references["en"] and "café" in clips[2].references["en"]
    assert clips[2].references["zh"] == "在音频中，说话者笑了😄，语气轻快"


def test_bad_clips_are_skipped_with_reasons(mer, tmp_path):
    table = pd.read_csv(mer / "final-EMER-reason.csv")
    table.loc[3, "english"] = ""
    table.loc[3, "chinese"] = ""
    table.to_csv(mer / "final-EMER-reason.csv", index=False)
    (mer / "audio" / "sample_00000004.wav").unlink()
    (mer / "audio" / "sample_00000000.wav").write_bytes(b"")
    clips, skips = load_mer2024(mer, ("en", "zh"), "full", tmp_path / "wav", 30.0)
    reasons = {s["id"]: s["reason"] for s in skips}
    assert set(reasons) == {"sample_00000000", "sample_00000003", "sample_00000004"}
    assert "empty file" in reasons["sample_00000000"]
    assert "empty reference" in reasons["sample_00000003"]
    assert "no audio file" in reasons["sample_00000004"]
    assert len(clips) == 2


def test_missing_folder_csv_and_column(mer, tmp_path):
    with pytest.raises(Mer2024Error, match="data.mer2024.path: MER2024 folder .* not found"):
        load_mer2024(tmp_path / "nowhere", ("en",), "full", tmp_path / "w", 30)
    table = pd.read_csv(mer / "final-EMER-reason.csv").drop(columns=["english"])
    table.to_csv(mer / "final-EMER-reason.csv", index=False)
    with pytest.raises(Mer2024Error, match="final-EMER-reason.csv: missing column\\(s\\) english"):
        load_mer2024(mer, ("en",), "full", tmp_path / "w", 30)
    (mer / "final-EMER-reason.csv").unlink()
    with pytest.raises(Mer2024Error, match="final-EMER-reason.csv: caption file not found"):
        load_mer2024(mer, ("en",), "full", tmp_path / "w", 30)


def test_all_unusable_is_an_error(mer, tmp_path):
    shutil.rmtree(mer / "audio")
    with pytest.raises(Mer2024Error, match="no usable clip"):
        load_mer2024(mer, ("en",), "full", tmp_path / "w", 30)


def test_video_without_ffmpeg_is_a_recorded_skip(mer, tmp_path, monkeypatch):
    (mer / "audio" / "sample_00000000.wav").unlink()
    (mer / "sample_00000000.mp4").write_bytes(b"\x00\x00\x00\x18ftypmp42")
    monkeypatch.setattr(shutil, "which", lambda name: None)
    clips, skips = load_mer2024(mer, ("en",), "full", tmp_path / "w", 30)
    assert skips and "ffmpeg is not installed" in skips[0]["reason"]
