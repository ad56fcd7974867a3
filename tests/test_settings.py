"""``hpccomm.settings``: one parser per kind, one rule for malformed values, the docs table.

Run as a script with ``--write-docs`` to rewrite the table in docs/settings.md from the
declarations.
"""
import os
import sys
import warnings
from pathlib import Path

import pytest

from hpccomm import settings

DOC = Path(__file__).resolve().parents[1] / "docs" / "settings.md"


@pytest.fixture(autouse=True)
def fresh_warnings(monkeypatch):
    """Each test sees every malformed value warn again (the rule warns once per process)."""
    monkeypatch.setattr(settings, "_warned", set())


# -- one parser per kind ---------------------------------------------------------------------
@pytest.mark.parametrize("text, value", [
    ("1", True), ("true", True), ("YES", True), (" On ", True),
    ("0", False), ("False", False), ("no", False), ("OFF", False)])
def test_flags_take_one_set_of_words_in_any_case(text, value):
    assert settings.parse_flag(text) is value


@pytest.mark.parametrize("text", ["2", "y", "enabled", ""])
def test_other_flag_words_are_malformed(text):
    with pytest.raises(ValueError, match="1/true/yes/on or 0/false/no/off"):
        settings.parse_flag(text)


def test_sizes_take_binary_suffixes_in_any_case():
    texts = ("8", "4K", "4KiB", "4kib", "2M", "2MB", "1G", "1e6", "0", " 64k ")
    assert [settings.parse_size(t) for t in texts] == [
        8, 4096, 4096, 4096, 2 << 20, 2 << 20, 1 << 30, 1000000, 0, 65536]
    for bad in ("", "K", "4X", "-1", "inf", "four"):
        with pytest.raises(ValueError, match="not a size"):
            settings.parse_size(bad)


def test_durations_take_the_unit_of_the_name_or_their_own():
    assert settings.parse_seconds("1.5") == 1.5
    assert settings.parse_seconds("200", 1e-6) == pytest.approx(200e-6)
    assert settings.parse_seconds("200ms", 1e-6) == pytest.approx(0.2)
    assert settings.parse_seconds("50us") == pytest.approx(50e-6)
    assert settings.parse_seconds("2 s", 1e-6) == 2.0
    for bad in ("", "-1", "1h", "soon", "nan"):
        with pytest.raises(ValueError, match="not a duration"):
            settings.parse_seconds(bad)


def test_counts_and_choices():
    assert settings.parse_count(" 16 ") == 16
    for bad in ("-1", "1.5", "x", ""):
        with pytest.raises(ValueError, match="whole number"):
            settings.parse_count(bad)
    assert settings.parse_choice("detail", ("OFF", "INFO", "DETAIL")) == "DETAIL"
    with pytest.raises(ValueError, match="not one of OFF, INFO, DETAIL"):
        settings.parse_choice("1", ("OFF", "INFO", "DETAIL"))


# -- reading: defaults, fallbacks, the rule for malformed values ----------------------------
def test_unset_or_blank_gives_the_default():
    for environ in ({}, {"HPCCOMM_SHM": ""}, {"HPCCOMM_SHM": "  "}):
        assert settings.SHM.get(environ) is True
    assert settings.SHM_FENCE.get({}) is None  # a flag without a default: decide later
    assert settings.SHM.get({"HPCCOMM_SHM": "off"}) is False
    assert settings.STORE_SPIN_US.get({"HPCCOMM_STORE_SPIN_US": "50"}) == pytest.approx(50e-6)
    assert settings.SHM_MIN_BYTES.get({"HPCCOMM_SHM_MIN_BYTES": "256K"}) == 256 * 1024


def test_every_flag_reads_the_same_words():
    """One rule for all flags: ``on`` means yes whatever the variable."""
    for setting in settings.SETTINGS.values():
        if setting.kind is settings.FLAG:
            assert setting.get({setting.name: "on"}) is True, setting.name
            assert setting.get({setting.name: "Off"}) is False, setting.name


def test_a_malformed_value_warns_once_naming_the_variable_and_keeps_the_default():
    environ = {"HPCCOMM_SHM_CHUNK": "lots"}
    with pytest.warns(RuntimeWarning) as caught:
        assert settings.SHM_CHUNK.get(environ) == 0
    message = str(caught[0].message)
    assert message == ("hpccomm: HPCCOMM_SHM_CHUNK='lots' is malformed: not a size: 'lots' "
                       "(e.g. 4096, 64K, 1MiB); using the default (0)"), message
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a second read of the same value stays quiet
        assert settings.SHM_CHUNK.get(environ) == 0
    with pytest.warns(RuntimeWarning, match="HPCCOMM_SHM_CHUNK='more'"):
        settings.SHM_CHUNK.get({"HPCCOMM_SHM_CHUNK": "more"})  # another value warns again


def test_the_debug_level_raises_as_torch_does_and_falls_back_to_torch_names():
    level = settings.DISTRIBUTED_DEBUG
    assert level.get({}) == "OFF"
    assert level.get({"TORCH_DISTRIBUTED_DEBUG": "detail"}) == "DETAIL"
    assert level.get({"HPCCOMM_DISTRIBUTED_DEBUG": "info",
                      "TORCH_DISTRIBUTED_DEBUG": "DETAIL"}) == "INFO"  # ours first
    with pytest.raises(ValueError, match="TORCH_DISTRIBUTED_DEBUG='1' is malformed"):
        level.get({"TORCH_DISTRIBUTED_DEBUG": "1"})


def test_call_time_settings_see_changes_made_after_import(monkeypatch):
    from hpccomm.backends.cuda import device as _cuda
    from hpccomm.diagnostics import excepthook

    monkeypatch.setenv("HPCCOMM_NCCL_BLOCKING_WAIT", "on")
    monkeypatch.setenv("HPCCOMM_NO_ABORT_ON_EXCEPTION", "yes")
    assert _cuda.blocking_wait() is True and excepthook.opted_out() is True
    monkeypatch.setenv("HPCCOMM_NCCL_BLOCKING_WAIT", "0")
    monkeypatch.delenv("HPCCOMM_NO_ABORT_ON_EXCEPTION")
    assert _cuda.blocking_wait() is False and excepthook.opted_out() is False


def test_overridden_sets_the_variable_for_a_block_only(monkeypatch):
    monkeypatch.delenv("HPCCOMM_SHM", raising=False)
    with settings.SHM.overridden("0"):
        assert settings.SHM.get() is False
    assert not settings.SHM.is_set()
    monkeypatch.setenv("HPCCOMM_SHM", "yes")
    with settings.SHM.overridden("0"):
        assert settings.SHM.get() is False
    assert os.environ["HPCCOMM_SHM"] == "yes"


# -- what users see: hpccomm info and the docs table ------------------------------------------
def test_info_lists_every_setting_hides_secrets_and_names_typos(monkeypatch):
    from hpccomm.cli import info

    monkeypatch.setenv("HPCCOMM_SHM", "0")
    monkeypatch.setenv("HPCCOMM_STORE_TOKEN", "sesame")
    monkeypatch.setenv("HPCCOMM_SHM_CHUNK", "lots")
    monkeypatch.setenv("HPCCOMM_SHM_MINBYTES", "1")  # a typo
    monkeypatch.setenv("TORCH_DISTRIBUTED_DEBUG", "INFO")
    monkeypatch.delenv("HPCCOMM_DISTRIBUTED_DEBUG", raising=False)
    section = info.settings_section()
    assert set(settings.SETTINGS) <= set(section)
    assert section["HPCCOMM_SHM"] == "0 (set)"
    assert section["HPCCOMM_STORE_TOKEN"] == "(set, hidden)"
    assert "sesame" not in str(info.collect(mpi=False))
    assert section["HPCCOMM_SHM_CHUNK"] == "0 (default: 'lots' is malformed)"
    assert section["HPCCOMM_DISTRIBUTED_DEBUG"] == "INFO (set from TORCH_DISTRIBUTED_DEBUG)"
    assert section["HPCCOMM_SHM_MINBYTES"] == "set, but hpccomm reads no such variable"


def test_the_docs_table_is_written_from_the_declarations():
    page = DOC.read_text()
    assert settings.with_table(page) == page, (
        "docs/settings.md's table differs from hpccomm/settings.py: run "
        "python tests/test_settings.py --write-docs")
    for name in settings.SETTINGS:
        assert f"`{name}`" in page


if __name__ == "__main__":
    if sys.argv[1:] != ["--write-docs"]:
        sys.exit("usage: python tests/test_settings.py --write-docs")
    DOC.write_text(settings.with_table(DOC.read_text()))
    print(f"wrote the table of {len(settings.SETTINGS)} settings to {DOC}")
