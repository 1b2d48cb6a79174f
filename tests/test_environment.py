"""Every environment variable reusebench reads is in docs/environment.md, and its lists take one style: spaces."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from reusebench.cli import common
from reusebench.config import asv_selection

REPO = Path(__file__).resolve().parents[1]
NAME = re.compile(r"REUSEBENCH_[A-Z0-9_]+")  # "REUSEBENCH_ASV_*" names a family, not a variable: it ends in "_"


def read_by_the_code() -> set[str]:
    sources = [*(REPO / "reusebench").rglob("*.py"), *(REPO / "benchmarks").glob("*.py"),
               *(REPO / "tools").glob("*.py"), *(REPO / "server_profiles").glob("*.yaml"), REPO / "Makefile"]
    found = {name for path in sources for name in NAME.findall(path.read_text())}
    return {name for name in found if not name.startswith("REUSEBENCH_TEST_") and not name.endswith("_")}


def test_the_reference_names_every_variable_the_code_reads_and_no_other() -> None:
    documented = set(re.findall(r"^\| `(REUSEBENCH_[A-Z0-9_]+)` \|", (REPO / common.ENVIRONMENT_DOC).read_text(), re.M))
    assert documented == read_by_the_code()
    assert len(documented) == 30  # 7 places, 4 profile pointers, 6 build settings, 13 asv selections


def test_a_comma_between_names_is_refused_naming_the_variable() -> None:
    with pytest.raises(asv_selection.SelectionError) as refused:
        asv_selection.from_env({"REUSEBENCH_ASV_SCENARIOS": "reask,after_sleep"})
    assert str(refused.value) == "REUSEBENCH_ASV_SCENARIOS: separate the names with spaces, not commas: 'reask,after_sleep'"
    with pytest.raises(asv_selection.SelectionError, match="^REUSEBENCH_ASV_SIZES: separate the names with spaces"):
        asv_selection.from_env({"REUSEBENCH_ASV_SIZES": "32K,128K"})


def test_lists_are_separated_by_spaces_and_a_variant_keeps_its_commas() -> None:
    chosen = asv_selection.from_env({"REUSEBENCH_ASV_SIZES": "2K  4K", "REUSEBENCH_ASV_SCENARIOS": "reask after_sleep",
                                     "REUSEBENCH_ASV_VARIANTS": "mmproj=off,cache-reuse=0 mmproj=on,cache-reuse=256"})
    assert (chosen.sizes, chosen.scenarios) == ((2048, 4096), ("reask", "after_sleep"))
    assert chosen.variants == ("mmproj=off,cache-reuse=0", "mmproj=on,cache-reuse=256")
    assert (chosen.profile, chosen.repeat, chosen.full_prefills) == ("tiny-qwen35", 1, False)


@pytest.mark.parametrize("name, value, says", [
    ("REUSEBENCH_ASV_SCENARIOS", "reask sleep", "REUSEBENCH_ASV_SCENARIOS: no scenario 'sleep'; valid: first_load "),
    ("REUSEBENCH_ASV_VARIANTS", "cache-reuse=0", "REUSEBENCH_ASV_VARIANTS: tiny-qwen35 has no variant 'cache-reuse=0'"),
    ("REUSEBENCH_ASV_REPEAT", "0", "REUSEBENCH_ASV_REPEAT: expected a whole number of sessions, 1 or more, got '0'"),
    ("REUSEBENCH_ASV_FULL_PREFILLS", "yes", "REUSEBENCH_ASV_FULL_PREFILLS: expected 0 or 1, got 'yes'"),
])
def test_a_name_the_suite_lacks_is_refused_naming_the_variable(name: str, value: str, says: str) -> None:
    with pytest.raises(asv_selection.SelectionError) as refused:
        asv_selection.from_env({name: value})
    assert str(refused.value).startswith(says)


def test_under_asv_s_own_environment_the_profile_runs_the_build_asv_made() -> None:
    assert asv_selection.from_env({"ASV_ENV_DIR": "/tmp/env"}).profile == "nightly-tiny-qwen35"


def test_the_records_to_publish_are_named_by_the_one_reader_too() -> None:
    assert asv_selection.records_file({}) is None
    assert asv_selection.records_file({"REUSEBENCH_ASV_RECORDS": "results/runs/r/records.jsonl"}) == Path(
        "results/runs/r/records.jsonl")


def test_no_module_but_the_one_reader_reads_a_reusebench_asv_variable() -> None:
    # asv's selection is one decision: a second reading of the environment could disagree with it
    read = re.compile(r"environ(?:\.get\(|\[)\s*[\"']REUSEBENCH_ASV_")
    sources = [*(REPO / "reusebench").rglob("*.py"), *(REPO / "benchmarks").glob("*.py")]
    readers = sorted(str(p.relative_to(REPO)) for p in sources if read.search(p.read_text()))
    assert readers == ["reusebench/config/asv_selection.py"]


def test_the_service_and_trace_benchmarks_take_their_selection_from_the_one_reader() -> None:
    chosen = asv_selection.services_from_env({"REUSEBENCH_ASV_TRACE": "", "REUSEBENCH_ASV_INTERFERENCE_REPEAT": "5"})
    assert (chosen.workload, chosen.interference, chosen.interference_repeat) == ("report-b-service", "interference", 5)
    assert (chosen.trace, chosen.trace_profile, chosen.trace_requests) == ("", "tiny-qwen35", 300)  # "": none runs
    for name in ("REUSEBENCH_ASV_INTERFERENCE_REPEAT", "REUSEBENCH_ASV_TRACE_REQUESTS"):
        with pytest.raises(asv_selection.SelectionError, match=f"^{name}: expected a whole number of"):
            asv_selection.services_from_env({name: "0"})
