"""One validator of options against a binary's --help (binaries.option_problem), used by profile loading
and by `reusebench check`, on a fake llama-server whose --help is known."""

from __future__ import annotations

from pathlib import Path

import pytest

from reusebench import check
from reusebench.config import profiles
from reusebench.llama import binaries

HELP = """\
----- common params -----

-c,    --ctx-size N                     size of the prompt context (default: 4096, 0 = loaded from model)
-ctxcp, --ctx-checkpoints, --swa-checkpoints N
                                        max number of context checkpoints to create per slot (default: 32)
--temp N                                temperature (default: 0.80)
--cache-reuse N                         min chunk size to attempt reusing from the cache via KV shifting
                                        (default: 0, [(card)])
--metrics                               enable prometheus compatible metrics endpoint (default: disabled)
--slot-save-path PATH                   path to save slot kv cache (default: disabled)
--draft-max N                           the argument has been removed. use --spec-draft-n-max
-ngl,  --gpu-layers, --n-gpu-layers N   max. number of layers to store in VRAM, either an exact number, 'auto', or
                                        'all'
"""


@pytest.fixture
def fake_binary(tmp_path: Path) -> binaries.Binary:
    path = tmp_path / "llama-server"
    path.write_text(f"#!/bin/sh\nif [ \"$1\" = --help ]; then cat <<'EOF'\n{HELP}EOF\n"
                    "else echo 'version: 4567 (abc1234)' >&2; fi\n")
    path.chmod(0o755)
    return binaries.resolve_binary(str(path), source="test")


@pytest.fixture
def table(fake_binary: binaries.Binary) -> dict[str, binaries.HelpOption]:
    return dict(binaries.help_table(fake_binary))


@pytest.mark.parametrize(("name", "value", "problem"), [
    ("cache-reues", 256, "unknown llama-server option (did you mean 'cache-reuse'?); flags get renamed"),
    ("log-jsonl", True, "unknown llama-server option (it exists from llama.cpp b11434)"),
    ("mlock", True, "unknown llama-server option (llama.cpp b11434 dropped it; see --load-mode)"),
    ("draft-max", 4, "removed from this llama-server: the argument has been removed. use --spec-draft-n-max"),
    ("metrics", 5, "--metrics is a bare flag; write true to pass it or false to leave it out, not 5"),
    ("cache-reuse", True, "--cache-reuse takes a value; true is only for bare flags"),
    ("ctx-checkpoints", "many", "--ctx-checkpoints takes an integer (N in --help), not 'many'"),
    ("ctx-size", "32K", "--ctx-size takes an integer (N in --help), not '32K'"),  # stoi would read 32
    ("ctx-size", 1.5, "--ctx-size takes an integer (N in --help), not 1.5"),
    ("temp", "warm", "--temp takes a number (N in --help), not 'warm'"),
])
def test_each_problem_is_named(table: dict[str, binaries.HelpOption], name: str, value: object, problem: str) -> None:
    found = binaries.option_problem(table, name, value)
    assert found is not None and found.startswith(problem)


@pytest.mark.parametrize(("name", "value"), [
    ("ctx-size", 8192), ("ctx-size", "8192"), ("ctx-checkpoints", -1), ("temp", 0.5), ("temp", 1),
    ("metrics", True), ("slot-save-path", "/tmp/slots"), ("swa-checkpoints", 8),
    ("n-gpu-layers", "all"), ("n-gpu-layers", 99),  # N without a stated default: the kind is unknown
])
def test_accepted_values(table: dict[str, binaries.HelpOption], name: str, value: object) -> None:
    assert binaries.option_problem(table, name, value) is None


def test_a_wrong_value_type_fails_the_profile_load_naming_file_and_field(tmp_path: Path,
                                                                         fake_binary: binaries.Binary) -> None:
    (tmp_path / "model.bin").write_bytes(b"")
    path = tmp_path / "p.yaml"
    path.write_text(f"binary: {fake_binary.path}\nmodel: model.bin\nsizes: [1K]\noptions:\n  ctx-checkpoints: many\n")
    with pytest.raises(profiles.ProfileError) as caught:
        profiles.load_profile(path)
    assert f"{path}:5:3: options.ctx-checkpoints: --ctx-checkpoints takes an integer (N in --help), not 'many'" in str(
        caught.value)


@pytest.mark.e2e
def test_check_reports_the_same_problem_as_unsupported(tmp_path: Path, fake_binary: binaries.Binary) -> None:
    (tmp_path / "model.bin").write_bytes(b"")
    path = tmp_path / "p.yaml"
    path.write_text(f"binary: {fake_binary.path}\nmodel: model.bin\nsizes: [1K]\n"
                    "options:\n  ctx-checkpoints: many\n  cache-reues: 256\n")
    variant = profiles.load_profile(path, check_binary=False).variants[0]
    verdicts = {v.option: v for v in check.check_variant(variant)}  # launches nothing: the binary rejects both
    table = binaries.help_table(fake_binary)
    for name, value in (("ctx-checkpoints", "many"), ("cache-reues", 256)):
        assert verdicts[name].verdict is check.Verdict.UNSUPPORTED
        assert verdicts[name].evidence == (
            f"`llama-server --help` of build abc1234: {binaries.option_problem(table, name, value)}",)
