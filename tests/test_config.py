import pytest

from speccap.config import ConfigError, load_params, params_from_dict


def test_repository_params_load_and_ci_profile_overrides(tmp_path):
    p = load_params("params.yaml")
    assert p.data.synthetic.test_per_language == 332
    text = open("params.yaml").read().replace("profile: default", "profile: ci")
    (tmp_path / "p.yaml").write_text(text)
    ci = load_params(tmp_path / "p.yaml")
    assert ci.data.synthetic.train_per_language < p.data.synthetic.train_per_language
    assert ci.features == p.features  # untouched sections stay


def test_unknown_key_is_named():
    with pytest.raises(ConfigError, match="data.synthetic.trian_per_language"):
        params_from_dict({"data": {"synthetic": {"trian_per_language": 3}}})


def test_wrong_type_and_choice_are_named():
    with pytest.raises(ConfigError, match="features.hop_length"):
        params_from_dict({"features": {"hop_length": "fast"}})
    with pytest.raises(ConfigError, match="data.source"):
        params_from_dict({"data": {"source": "youtube"}})
    with pytest.raises(ConfigError, match="data.languages"):
        params_from_dict({"data": {"languages": ["fr"]}})


def test_unknown_profile_and_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="profile"):
        params_from_dict({"profile": "huge"})
    with pytest.raises(ConfigError, match="not found"):
        load_params(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("data: [unclosed")
    with pytest.raises(ConfigError, match="bad.yaml"):
        load_params(bad)
