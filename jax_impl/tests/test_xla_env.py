"""The GPU scatter-add workaround: which installs need it, and how it goes into XLA_FLAGS."""
import pytest

from jax_impl import xla_env
from jax_impl.xla_env import parse_version, with_ftz_atomics, workaround_applies


@pytest.mark.parametrize("version,plugin,expected", [
    ("0.10.1", True, False), ("0.10.2", True, True), ("0.11.0", True, True), ("0.11.1", True, False),
    ("0.11.2", True, False), ("0.10.2", False, False), (None, True, False), ("0.11.0.dev20260701", True, True)])
def test_only_jaxlib_0_10_2_to_0_11_0_with_a_cuda_plugin_needs_the_workaround(version, plugin, expected):
    assert workaround_applies(version, plugin) is expected


def test_versions_parse_to_their_leading_triplet():
    assert parse_version("0.11.0rc1") == (0, 11, 0) and parse_version("garbage") == (0, 0, 0)


def test_the_option_is_appended_as_a_backend_extra_option():
    assert with_ftz_atomics("") == "--xla_backend_extra_options=-nvptx-allow-ftz-atomics"
    assert with_ftz_atomics("--xla_gpu_autotune_level=0") == (
        "--xla_gpu_autotune_level=0 --xla_backend_extra_options=-nvptx-allow-ftz-atomics")


def test_existing_backend_extra_options_are_extended_with_a_comma():
    assert with_ftz_atomics("--xla_backend_extra_options=-foo --x=1") == (
        "--xla_backend_extra_options=-foo,-nvptx-allow-ftz-atomics --x=1")


def test_flags_that_already_have_it_or_flush_everything_are_left_alone():
    for flags in ("--xla_backend_extra_options=-nvptx-allow-ftz-atomics", "--xla_gpu_ftz=true"):
        assert with_ftz_atomics(flags) == flags


def test_configure_is_idempotent_and_records_what_is_in_force(monkeypatch):
    monkeypatch.setattr(xla_env, "installed", lambda: ("0.10.2", True))
    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=2")
    first = xla_env.configure()
    assert xla_env.configure() == first == xla_env.record() == {
        "xla_scatter_workaround": True,
        "xla_flags": "--xla_force_host_platform_device_count=2 --xla_backend_extra_options=-nvptx-allow-ftz-atomics"}


def test_configure_changes_nothing_where_the_jaxlib_is_not_affected(monkeypatch):
    monkeypatch.setattr(xla_env, "installed", lambda: ("0.10.2", False))  # this CPU machine's install
    monkeypatch.delenv("XLA_FLAGS", raising=False)
    assert xla_env.configure() == {"xla_scatter_workaround": False, "xla_flags": ""}
