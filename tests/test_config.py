"""Settings precedence: defaults < YAML < environment < explicit overrides."""
import pytest

from esqbe.settings.config import ConfigError, Settings, load_settings


def test_precedence(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("k: 7\nurl: http://from-file:9200\nrescorer_params: {tau: 0.3}\nverify_certs: false\n")
    s = load_settings(cfg, env={})
    assert (s.k, s.url, s.rescorer_params, s.verify_certs) == (7, "http://from-file:9200", {"tau": 0.3}, False)
    s = load_settings(cfg, env={"ESQBE_URL": "http://from-env:9200"})
    assert s.url == "http://from-env:9200"
    s = load_settings(cfg, env={"ESQBE_URL": "http://from-env:9200"}, url="http://flag:9200", k=None)
    assert s.url == "http://flag:9200" and s.k == 7  # None means "flag not given"
    assert load_settings(env={"ESQBE_CONFIG": str(cfg)}).k == 7


def test_errors(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_settings(tmp_path / "missing.yaml", env={})
    bad = tmp_path / "bad.yaml"
    bad.write_text("k: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_settings(bad, env={})
    bad.write_text("k: ten\n")
    with pytest.raises(ConfigError, match="k:"):
        load_settings(bad, env={})
    bad.write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_settings(bad, env={})
    with pytest.raises(ConfigError, match="unknown setting"):
        Settings().replace(nope=1)


def test_secrets_are_redacted():
    assert Settings(api_key="s3cret").to_dict()["api_key"] == "***"
