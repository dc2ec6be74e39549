"""The resume key ring from settings: its format, the single secret, the generated one."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import SecretStr

from processor.config.resume_secret import DEFAULT_KEY_ID, parse_resume_secrets, resume_keys
from processor.config.settings import Settings
from processor.errors import ConfigurationError
from processor.facts.keyring import DEFAULT_KEY_ID as RING_DEFAULT_KEY_ID
from processor.facts.keyring import KEY_ID_PATTERN, KeyRing

NEW = "new-secret-0123456789"
OLD = "old-secret-0123456789"


def test_several_keys_in_order_the_first_signs(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path, resume_secrets=SecretStr(f"k2:{NEW}, k1:{OLD}"))
    keys = resume_keys(settings)
    assert keys == (("k2", NEW.encode()), ("k1", OLD.encode()))
    assert KeyRing(keys).signing == ("k2", NEW.encode())


def test_the_secrets_come_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PROCESSOR_RESUME_SECRETS", f"b:{NEW},a:{OLD}")
    settings = Settings(data_dir=tmp_path, broker="kafka://127.0.0.1:9092")
    assert isinstance(settings.resume_secrets, SecretStr)
    assert NEW not in repr(settings)
    assert [kid for kid, _ in resume_keys(settings)] == ["b", "a"]


def test_the_single_secret_is_the_default_key(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path, resume_secret=SecretStr(OLD))
    assert resume_keys(settings) == ((DEFAULT_KEY_ID, OLD.encode()),)
    assert DEFAULT_KEY_ID == RING_DEFAULT_KEY_ID


def test_the_embedded_log_generates_one_key_and_keeps_it(tmp_path: Path) -> None:
    first = resume_keys(Settings(data_dir=tmp_path))
    assert [kid for kid, _ in first] == [DEFAULT_KEY_ID] and len(first[0][1]) == 64
    assert resume_keys(Settings(data_dir=tmp_path)) == first


def test_kafka_needs_a_configured_key(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="PROCESSOR_RESUME_SECRETS"):
        resume_keys(Settings(data_dir=tmp_path, broker="kafka://127.0.0.1:9092"))


def test_both_settings_at_once_are_refused(tmp_path: Path) -> None:
    settings = Settings(
        data_dir=tmp_path, resume_secret=SecretStr(OLD), resume_secrets=SecretStr(f"a:{NEW}")
    )
    with pytest.raises(ConfigurationError, match="not both"):
        resume_keys(settings)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "entry 1 must be kid:secret"),
        (f"a:{NEW},", "entry 2 must be kid:secret"),
        (NEW, "entry 1 must be kid:secret"),
        (f"a.b:{NEW}", "entry 1 must be kid:secret"),
        (f"{'k' * 33}:{NEW}", "entry 1 must be kid:secret"),
        ("a:short", "key 'a' must be at least 16 characters"),
        (f"a:{NEW},a:{OLD}", "names key 'a' twice"),
    ],
)
def test_a_bad_key_list_is_a_clear_error_that_shows_no_secret(text: str, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message) as raised:
        parse_resume_secrets(text)
    assert NEW not in str(raised.value) and OLD not in str(raised.value)


def test_config_and_facts_agree_on_what_a_key_id_is() -> None:
    for kid in ("a", "K-2_x", "9" * 32):
        assert parse_resume_secrets(f"{kid}:{NEW}")[0][0] == kid
        assert KEY_ID_PATTERN.fullmatch(kid)
