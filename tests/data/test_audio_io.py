import tracemalloc

import numpy as np
import pytest
import soundfile as sf

from speccap.data.audio_io import AudioError, read_audio, write_wav


def test_reads_16k_mono_unchanged(tone, write_audio):
    x = tone(200, 1.0)
    clip = read_audio(write_audio("a.wav", x))
    assert clip.sample_rate == 16000 and clip.notes == []
    np.testing.assert_allclose(clip.samples, x, atol=1 / 32768 + 1e-6)


@pytest.mark.parametrize("sr", [8000, 44100, 48000])
def test_other_rates_are_resampled_to_16k(tone, write_audio, sr):
    clip = read_audio(write_audio(f"r{sr}.wav", tone(200, 1.5, sr=sr), sr=sr))
    assert clip.sample_rate == 16000 and clip.source_rate == sr
    assert abs(len(clip.samples) - 24000) <= 2
    assert any("resampled" in n for n in clip.notes)
    # the tone survives resampling: dominant frequency still ~200 Hz
    spec = np.abs(np.fft.rfft(clip.samples))
    assert abs(np.argmax(spec) * 16000 / len(clip.samples) - 200) < 5


def test_stereo_is_downmixed(tone, write_audio):
    x = tone(200, 1.0)
    clip = read_audio(write_audio("st.wav", np.stack([x, 0.5 * x], axis=1)))
    assert clip.samples.ndim == 1 and clip.source_channels == 2
    np.testing.assert_allclose(clip.samples, 0.75 * x, atol=2e-4)
    assert any("downmixed" in n for n in clip.notes)


def test_empty_file(tmp_path):
    p = tmp_path / "empty.wav"
    p.write_bytes(b"")
    with pytest.raises(AudioError, match="empty.wav: empty file"):
        read_audio(p)


def test_non_audio_file(tmp_path):
    p = tmp_path / "notes.wav"
    p.write_text("these are not samples\n" * 50)
    with pytest.raises(AudioError, match="notes.wav: not a readable audio file"):
        read_audio(p)


def test_missing_file_and_directory(tmp_path):
    with pytest.raises(AudioError, match="file not found"):
        read_audio(tmp_path / "nope.wav")
    with pytest.raises(AudioError, match="directory"):
        read_audio(tmp_path)


def test_truncated_wav(tone, write_audio):
    p = write_audio("cut.wav", tone(200, 2.0))
    data = p.read_bytes()
    p.write_bytes(data[: len(data) // 2])
    with pytest.raises(AudioError, match="cut.wav: truncated WAV"):
        read_audio(p)


def test_silence_is_refused(write_audio):
    with pytest.raises(AudioError, match="silent audio"):
        read_audio(write_audio("quiet.wav", np.zeros(16000, np.float32)))


def test_clipped_audio_is_kept_and_noted(tone, write_audio):
    x = np.clip(tone(200, 1.0) * 4, -1, 1)
    clip = read_audio(write_audio("hot.wav", x))
    assert any(n.startswith("clipped") for n in clip.notes)
    assert np.max(np.abs(clip.samples)) <= 1.0


def test_ten_minute_file_is_trimmed_with_bounded_memory(tmp_path):
    # 10 minutes of 48 kHz stereo: 230 MB as float32 if read whole
    path = tmp_path / "long.wav"
    rng = np.random.default_rng(0)
    with sf.SoundFile(str(path), "w", 48000, 2, subtype="PCM_16") as fh:
        block = (0.1 * rng.standard_normal((48000 * 10, 2))).astype(np.float32)
        for _ in range(60):
            fh.write(block)
    tracemalloc.start()
    clip = read_audio(path, max_seconds=30.0)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert abs(clip.seconds - 30.0) < 0.01
    assert clip.source_seconds == pytest.approx(600.0)
    assert any("trimmed from 600.0 s" in n for n in clip.notes)
    assert peak < 40e6, f"peak traced memory {peak / 1e6:.0f} MB"


def test_write_wav_is_atomic_and_roundtrips(tmp_path, tone):
    p = tmp_path / "sub" / "x.wav"
    write_wav(p, tone(300, 0.5))
    assert p.exists() and not (tmp_path / "sub" / "x.wav.part").exists()
    assert sf.info(str(p)).samplerate == 16000


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_float_wav_with_non_finite_samples_is_refused(tone, write_audio, bad):
    x = tone(200, 1.0).astype(np.float32)
    x[100:110] = bad
    path = write_audio("nan.wav", x, subtype="FLOAT")
    with pytest.raises(AudioError, match=r"nan\.wav: 10 of 16000 samples are NaN or infinite"):
        read_audio(path)


def test_too_short_clip_is_refused(tone, write_audio):
    path = write_audio("blip.wav", tone(200, 0.05))
    with pytest.raises(AudioError, match=r"blip\.wav: too short to caption: 0\.050 s \(the minimum is 0\.5 s\)"):
        read_audio(path)
    assert read_audio(write_audio("ok.wav", tone(200, 0.5))).seconds == pytest.approx(0.5)
