"""A Mooncake-format trace: read and checked (a bad line named by its number and field), selected, scaled, its own
statistics against the shipped file, and its prompts: blocks of the model's tokens with exactly the trace's
sharing. Pure: no server."""

from __future__ import annotations

import dataclasses
import gzip
import json
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from reusebench.cli import main
from reusebench.cli.whatif import distinct_launches
from reusebench.config import profiles
from reusebench.llama import binaries
from reusebench.tap.trace import TraceWriter
from reusebench.trace import mooncake
from reusebench.trace.mooncake import TraceError, TraceSelection, read_trace
from reusebench.trace.predict import Prediction
from reusebench.trace.prompts import BlockIds, Vocabulary, trace_prompts
from reusebench.whatif import combinations as combos
from reusebench.whatif.prediction import Outcome

LINE = {"timestamp": 0, "input_length": 1000, "output_length": 10, "hash_ids": [0, 1]}


def write(path: Path, *rows: object) -> Path:
    path.write_text("".join((row if isinstance(row, str) else json.dumps(row)) + "\n" for row in rows))
    return path


@pytest.mark.parametrize(("row", "named"), [
    ("{not json", "line 2: not a JSON object (Expecting property name"),
    ([1, 2], "line 2: not a JSON object"),
    ({**LINE, "hash_ids": None}, "line 2: hash_ids: expected a list of block ids, got NoneType"),
    ({k: v for k, v in LINE.items() if k != "output_length"}, "line 2: output_length: missing"),
    ({**LINE, "input_length": "1000"}, 'line 2: input_length: expected a whole number >= 0, got "1000"'),
    ({**LINE, "hash_ids": [0, -1]}, "line 2: hash_ids[1]: expected a whole number >= 0, got -1"),
    # 1000 tokens are two 512-token blocks: three ids cannot be
    ({**LINE, "hash_ids": [0, 1, 2]}, "line 2: hash_ids: 3 ids for input_length 1000, which needs 2 blocks"),
    ({**LINE, "timestamp": True}, "line 2: timestamp: expected a whole number >= 0, got true"),
])
def test_a_bad_line_is_named_by_number_and_field(tmp_path: Path, row: object, named: str) -> None:
    path = write(tmp_path / "t.jsonl", LINE, row)
    with pytest.raises(TraceError) as error:
        read_trace(path)
    assert str(error.value).startswith(f"{path}: {named}")


def test_the_command_names_the_bad_line_before_any_server(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path / "t.jsonl", LINE, LINE, {**LINE, "output_length": -3})
    assert main(["replay", str(path), "--profile", "tiny-llama", "--results", str(tmp_path / "r")]) == 3
    assert f"{path}: line 3: output_length: expected a whole number >= 0, got -3" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()  # nothing started, nothing written


def test_a_trace_that_is_not_there_names_the_shipped_ones() -> None:
    with pytest.raises(TraceError, match="nope: no such trace file, nor a shipped trace .*mooncake-conversation"):
        TraceSelection("nope").load()


def test_the_shipped_trace_has_the_papers_requests_and_means() -> None:
    """Table 2 of the paper: 12,031 requests, 12,035 tokens in and 343 out on average; the cache ratio by our
    definition (an unbounded prefix cache in file order) is 54,098,411 of 144,793,823 input tokens: 37.4%."""
    whole, _ = TraceSelection("mooncake-conversation").load()
    found = mooncake.stats(whole)
    assert (found.requests, round(found.mean_input), round(found.mean_output)) == (12_031, 12_035, 343)
    assert (found.cached_tokens, found.input_tokens) == (54_098_411, 144_793_823)


def test_selection_and_scale_keep_every_request_s_blocks() -> None:
    # requests 0..299; at 1/16 a block is 32 tokens and the first request's 6,758 tokens become ceil(6758 / 16) = 423,
    # still 14 blocks; its 500-token answer becomes 32 (rounded up)
    whole, trace = TraceSelection("mooncake-conversation", scale=16, start=0, stop=300).load()
    assert (len(trace.requests), trace.block_tokens, trace.scale) == (300, 32, 16)
    first = trace.requests[0]
    assert (first.input_length, first.output_length, len(first.hash_ids)) == (423, 32, 14)
    assert TraceSelection("mooncake-conversation", start=100, limit=5).load()[1].requests[0].line == 101
    with pytest.raises(ValueError, match="--scale 3: the block of 512 tokens must divide by it"):
        whole.scaled(3)


def test_a_gzipped_trace_reads_as_the_plain_one(tmp_path: Path) -> None:
    plain = write(tmp_path / "t.jsonl", LINE, {**LINE, "timestamp": 5})
    packed = tmp_path / "t.jsonl.gz"
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    assert read_trace(packed).requests == read_trace(plain).requests


def test_prompts_share_exactly_what_the_trace_shares() -> None:
    """Two requests whose first k ids are equal share k blocks of ids and then part at once (the pool's ids never
    continue another block by chance here: a 4,096-id pool and blocks that differ at their first id)."""
    _, trace = TraceSelection("mooncake-conversation", scale=16, limit=60).load()
    blocks = BlockIds(Vocabulary(tuple(range(1000, 5096)), answer=7), trace.block_tokens)
    prompts = trace_prompts(trace, blocks)
    a, b = prompts[0], prompts[1]  # ids [0, 1, ...] and [0, 14, ...]: one block in common
    ta, tb = blocks.tokens(a.prompt), blocks.tokens(b.prompt)
    assert (len(ta), len(tb)) == (a.request.input_length, b.request.input_length)
    assert ta[:32] == tb[:32] and ta[32] != tb[32]
    # the ideal: request 2 re-processes all but the first block, 458 - 32 = 426 of its 458 tokens
    assert (b.request.input_length, b.ideal) == (458, 426)
    assert blocks.tokens(blocks.answer(40)) == [7] * 40


def test_the_tap_s_trace_numbers_prefixes_and_keeps_no_ids(tmp_path: Path) -> None:
    """Three prompts: 1,100 tokens, the same grown to 1,600, and another of 600: block ids 0 1 2, then 0 1 3 4 (its
    third block now full, so another id), then 5 6. No id of any prompt is in the file."""
    writer = TraceWriter(tmp_path / "mine.jsonl", started_at=100.0)
    first = list(range(50_000, 51_100))
    writer.write(100.5, first, 20)
    writer.write(101.25, first + list(range(60_000, 60_500)), 30)
    writer.write(102.0, list(range(70_000, 70_600)), 5)
    writer.close()
    lines = [json.loads(line) for line in (tmp_path / "mine.jsonl").read_text().splitlines()]
    assert [(r["timestamp"], r["input_length"], r["output_length"], r["hash_ids"]) for r in lines] == [
        (500, 1100, 20, [0, 1, 2]), (1250, 1600, 30, [0, 1, 3, 4]), (2000, 600, 5, [5, 6])]
    assert read_trace(tmp_path / "mine.jsonl").requests[1].hash_ids == (0, 1, 3, 4)
    with pytest.raises(FileExistsError):
        TraceWriter(tmp_path / "mine.jsonl", started_at=0.0)


# -- whatif's command line: every bad --try named before anything is predicted ------------------------------------


@pytest.mark.parametrize(("given", "named"), [
    ("cache-ram", "expected OPTION=VALUE[,VALUE...], e.g. cache-ram=0,8192"),
    ("threads=4", "threads is not an option the reuse model decides on; try one of parallel, cache-ram"),
    ("cache-rma=0", "cache-rma is not an option the reuse model decides on (did you mean cache-ram?); try one of"),
    ("parallel=two", "parallel: 'two' is not a whole number"),
    ("kv-unified=maybe", "kv-unified: 'maybe' is not on or off"),
])
def test_a_bad_try_is_a_usage_error_naming_it(given: str, named: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stopped:
        main(["whatif", "mooncake-conversation", "--profile", "tiny-llama", "--try", given])
    assert stopped.value.code == 2
    assert named in capsys.readouterr().err


def test_a_try_the_binary_lacks_is_named_with_the_binary(tmp_path: Path) -> None:
    """A llama-server whose --help has no --ctx-checkpoints (an older build's, made here from the real one's by
    leaving its line out): trying the option is an error naming it and the binary, before any prediction."""
    variant = profiles.load_profile("tiny-llama").variants[0]
    real_help = subprocess.run([str(variant.binary.path), "--help"], capture_output=True, text=True).stdout
    older = tmp_path / "llama-server"
    older.write_text("#!/bin/sh\ncat <<'EOF'\n" + "".join(line for line in real_help.splitlines(keepends=True)
                                                           if "--ctx-checkpoints" not in line) + "EOF\n")
    older.chmod(0o755)
    older_binary = binaries.Binary(path=older)
    lacking = dataclasses.replace(variant, binary=older_binary)
    assert len(combos.combinations(lacking, binaries.help_table(older_binary), [combos.parse_try("parallel=1,2")])) == 3  # as it is, and two
    with pytest.raises(ValueError, match=f"--try ctx-checkpoints: unknown llama-server option.*{older}"):
        combos.combinations(lacking, binaries.help_table(older_binary), [combos.parse_try("ctx-checkpoints=8,32")])


@pytest.mark.e2e
def test_a_combination_whose_slot_cannot_hold_the_longest_request_is_left_out(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # the first 40 requests at 1/16: the longest is 5,475 tokens with its answer; a 1,024-token context cannot hold it
    assert main(["whatif", "mooncake-conversation", "--scale", "16", "--limit", "40", "--profile", "tiny-llama",
                 "--try", "ctx-size=1024,8192", "--rate", "1000", "--results", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "left out: --ctx-size 1024: a slot of 1,024 tokens cannot hold" in out and "is 5,475)" in out
    ranked = [line.split()[1:] for line in out.splitlines() if line.split()[:1] in (["1"], ["2"])]  # rank, launch
    assert [row[:2] for row in ranked] == [["as", "it"], ["--ctx-size", "8192"]]  # as it is, and the one that fits


def test_whatif_verifies_each_distinct_launch_once() -> None:
    # the README's --verify 3 replayed "as it is" and a combination equal to it (it set what the profile sets):
    # two identical servers, ten minutes each. Only the launch line matters to the server: each is replayed once.
    def outcome(setting: tuple, *args: str) -> Outcome:
        return Outcome(SimpleNamespace(setting=setting), SimpleNamespace(args=["-m", "m.gguf", *args]), Prediction())

    as_it_is = outcome((), "--parallel", "1")
    same = outcome((("parallel", 1),), "--parallel", "1")
    two, four, eight = (outcome((("parallel", n),), "--parallel", str(n)) for n in (2, 4, 8))
    assert distinct_launches(as_it_is, [same, as_it_is, two, four, eight], 2) == [as_it_is, two, four]
