"""Generated bad input never ends in a traceback: profiles and command lines from hypothesis go through
`run --dry-run`, `check` and `profiles`, and each ends with an exit status from the table and, when it fails, one
message that names what was wrong (argparse's usage line for a command line)."""

from __future__ import annotations

import contextlib
import io
import tempfile
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reusebench.cli import main
from reusebench.cli.exits import Exit

pytestmark = pytest.mark.e2e

FIELDS = ["description", "extends", "binary", "model", "mmproj", "lora", "options", "sizes", "scenarios", "verify",
          "n_predict", "corpus", "matrix"]
OPTIONS = ["cache-ram", "cache-reuse", "ctx-size", "parallel", "ctx-checkpoints", "swa-full", "kv-unified",
           "ubatch-size", "no-such-option", "sleep-idle-seconds"]
scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**40, 2**40), st.floats(allow_nan=True),
                    st.sampled_from(["4GB", "", "tiny:llama", "tiny:nosuch", "real:nosuch", "/no/such.gguf", "2K",
                                     "${UNSET_VARIABLE_OF_REUSEBENCH}", "default", "-1", "1e3", "tiny-base"]),
                    st.text(max_size=12))
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                      st.dictionaries(st.sampled_from(OPTIONS), inner, max_size=3)),
                      max_leaves=6)
# any fields, or the tiny base with only its options varied (so the launch and the plan are reached too)
profiles_ = st.one_of(
    st.dictionaries(st.one_of(st.sampled_from(FIELDS), st.text(min_size=1, max_size=8)), values, max_size=6),
    st.dictionaries(st.sampled_from(OPTIONS), scalars, max_size=3).map(lambda options: {"options": options}),
).map(lambda d: {"extends": "tiny-base", **d})
sizes = st.sampled_from(["2K", "0", "-3", "64K", "1M", "abc", "2048", "300000", "1.5K", ""])
STATUSES = {code.value for code in Exit}


def ends_cleanly(argv: list[str]) -> tuple[int, str]:
    """The command's exit status and what it printed on stderr; a traceback is no exit status at all."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            status = main(argv)
        except SystemExit as exit_:  # argparse's usage error
            status = int(exit_.code or 0)
    return status, err.getvalue()


def written(profile: dict[str, object], directory: Path) -> str:
    path = directory / "generated.yaml"
    path.write_text(yaml.safe_dump(profile, allow_unicode=True))
    return str(path)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(profile=profiles_, size=sizes)
def test_a_generated_profile_and_size_never_end_a_dry_run_in_a_traceback(profile: dict[str, object],
                                                                          size: str) -> None:
    with tempfile.TemporaryDirectory() as directory:
        status, err = ends_cleanly(["run", "--profile", written(profile, Path(directory)), "--size", size,
                                    "--scenario", "resend", "--dry-run"])
    assert status in STATUSES and "Traceback" not in err
    if status == Exit.CONFIG:  # a file it reads is wrong: the message names it (generated.yaml, or its variant)
        assert err.startswith("reusebench run: ") and "generated" in err, err
    elif status == Exit.USAGE:  # a message, or argparse's usage and its error line
        assert err.strip().splitlines()[-1].startswith("reusebench run"), err


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(profile=profiles_, option=st.text(alphabet="abcdefghijklmnopqrstuvwxyz-", min_size=1, max_size=10))
def test_a_generated_profile_never_ends_a_check_in_a_traceback(profile: dict[str, object], option: str) -> None:
    # an --option no variant checks: a good profile stops before its server starts, a bad one at the profile
    with tempfile.TemporaryDirectory() as directory:
        status, err = ends_cleanly(["check", "--profile", written(profile, Path(directory)), "--option",
                                    f"zz-{option}", "--results", directory])
    assert status in (Exit.USAGE, Exit.CONFIG) and "Traceback" not in err, err
    assert err.strip().splitlines()[-1].startswith("reusebench check"), err  # its one line, after any progress


@settings(max_examples=40, deadline=None)
@given(argv=st.lists(st.sampled_from(["--json", "--wide", "-q", "-v", "--size", "2K", "--profile", "x", "--nope",
                                      "run", "check", "profiles", "inspect", "report", "--option", "--scenarios"]),
                     max_size=5))
def test_a_generated_command_line_ends_with_a_status_from_the_table(argv: list[str]) -> None:
    status, err = ends_cleanly(["profiles", *argv])
    assert status in STATUSES and "Traceback" not in err
