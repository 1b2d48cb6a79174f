"""Report A on real weights, and a wrong reuse that still reads WRONG.

Gemma 3 270M Q4_K_M (installed by `reusebench models --real`, a prerequisite of `make test`) has sharp
distributions whose logprobs move with the batch shape, and a 512-token sliding window on five of every six
layers. Report A's six steps on it at 2K must read as the reuse model predicts, and every reused output must be
identical or within the measured noise band. The other side of the check: b11434 with --swa-full drops the
window test, and a RAM copy holds only the window of its last position, so a resend after an interleave reads
a window with a hole at its start. That is a real wrong reuse (the tiny Gemma 3-class model, random weights):
the model predicts it and the output check measures it, while the same steps without --swa-full are right.
A chat's user messages are found with the marker the model's own template renders.
"""

from __future__ import annotations

import pytest

from reusebench.config import profiles
from reusebench.llama import facts
from reusebench.llama.client import LlamaClient
from reusebench.llama.process import ServerProcess
from reusebench.records import Record
from reusebench.reuse import segments
from reusebench.reuse.verification import IDENTICAL, WITHIN_NOISE, WRONG

from conftest import default_llama_server, report_a

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def gemma(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], Record]:
    return report_a("gemma3-270m", "default", tmp_path_factory.mktemp("results"))


def test_report_a_on_the_real_model_reads_as_the_reuse_model_predicts(gemma):
    assert [step for step, r in gemma.items() if r.prompt_n != r.expected] == []
    # The window cache holds only the window after the interleave's RAM round trip (tests/test_swa.py), so the
    # re-ask returns to the checkpoint 4 + n_ubatch before the cold prompt's end, at its last position: it keeps
    # cold.prompt_tokens - 516 - 1 tokens.
    cold, reask = gemma[("first_load", "cold")], gemma[("reask", "new question")]
    assert reask.prompt_n == reask.prompt_tokens - (cold.prompt_tokens - 517)


def test_every_reused_output_on_the_real_model_is_identical_or_within_the_noise_band(gemma):
    checked = {step: r.extra["output_check"] for step, r in gemma.items() if r.matches_reference is not None}
    assert checked and set(checked.values()) <= {IDENTICAL, WITHIN_NOISE}
    bands = {r.extra["noise_band"] for r in gemma.values() if r.extra.get("output_check") == WITHIN_NOISE}
    assert all(band is not None and band > 0 for band in bands)  # real weights: batch shape moves the numbers


@pytest.fixture(scope="module")
def swa_full(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], Record]:
    return report_a("tiny-gemma3", "swa-full=on", tmp_path_factory.mktemp("results"))


@pytest.fixture(scope="module")
def swa_window(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], Record]:
    return report_a("tiny-gemma3", "swa-full=off", tmp_path_factory.mktemp("results"))


def test_a_window_with_a_hole_reads_wrong_and_was_predicted(swa_full):
    back = swa_full[("interleave", "back to first")]
    assert (back.extra["output_check"], back.extra.get("expected_wrong_output")) == (WRONG, True)
    assert back.verdict == "WRONG OUTPUT"
    # a slot file holds the same window-only state: its resend reads the same hole
    assert swa_full[("restore_disk", "resend")].extra["output_check"] == WRONG


def test_the_same_steps_with_the_window_test_are_right(swa_window):
    # (without --swa-full the restored slot file's resend re-processes everything: nothing reused, nothing to check)
    for step in (("interleave", "back to first"), ("reask", "new question")):
        r = swa_window[step]
        assert r.extra["output_check"] in (IDENTICAL, WITHIN_NOISE) and not r.extra.get("expected_wrong_output")


@pytest.mark.parametrize("profile, marker", [("tiny-llama", facts.CHATML_USER_START),
                                             ("gemma3-270m", "<start_of_turn>user")])
def test_a_user_message_starts_where_the_models_own_template_says(profile: str, marker: str) -> None:
    # the run marks where the server checkpoints a chat prompt (its user messages) with the marker the template
    # renders, not ChatML's: on Gemma a ChatML marker would mark nothing
    args = profiles.load_profile(profile).variants[0].server_args()
    with ServerProcess(default_llama_server(), (*args, "-c", "2048")) as server:
        client = LlamaClient(server.base_url, server.api_key)
        assert facts.user_start_marker(client.apply_template) == marker
        chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "One?"},
                {"role": "assistant", "content": "Two."}, {"role": "user", "content": "Three?"}]
        tokens = client.tokenize(client.apply_template(chat), add_special=True)
        delimiter = client.tokenize(marker, add_special=False)
        assert len(segments.user_starts(tokens, delimiter)) == 2  # both user turns, the system message folded or not
