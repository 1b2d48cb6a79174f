"""One parser of prompt sizes, and every place that takes one refuses what it refuses, naming itself.

(Profiles' `sizes:` entries: tests/test_profiles.py, in its table of errors.)
"""

from __future__ import annotations

import pytest

from reusebench import cli
from reusebench.config import asv_selection
from reusebench.config.sizes import SizeError, parse_size, size_label

REFUSED = ("-5", "0", "abc")


@pytest.mark.parametrize("given, tokens", [(2048, 2048), ("2048", 2048), ("32K", 32768), ("128k", 131072),
                                           ("1M", 1048576), (" 4K ", 4096)])
def test_accepted_forms(given: object, tokens: int) -> None:
    assert parse_size(given) == tokens


@pytest.mark.parametrize("given", [*REFUSED, -5, 0, "1.5K", "32KB", "", "K", True, 2.0, None])
def test_refused_forms_say_what_is_accepted(given: object) -> None:
    with pytest.raises(SizeError) as refused:
        parse_size(given)
    assert str(refused.value) == f"expected a positive token count such as 2048, 32K or 1M, got {given!r}"


def test_labels_are_the_asv_parameter_values() -> None:
    assert [size_label(t) for t in (2048, 32768, 131072, 1048576, 1000)] == ["2K", "32K", "128K", "1024K", "1000"]


@pytest.mark.parametrize("given", REFUSED)
def test_the_command_line_names_the_option(given: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main(["run", "--profile", "tiny-llama", "--size", given])
    assert exited.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"reusebench run: error: argument --size: expected a positive token count such as 2048, 32K or 1M, "
        f"got {given!r}")


@pytest.mark.parametrize("given", REFUSED)
def test_the_asv_selection_names_its_variable(given: str) -> None:
    with pytest.raises(ValueError, match=rf"^REUSEBENCH_ASV_SIZES: expected a positive token count .*, got '{given}'$"):
        asv_selection.from_env({"REUSEBENCH_ASV_SIZES": given})
