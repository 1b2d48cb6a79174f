"""Short probes of one llama-server binary, one per capability where builds differ.

Each probe runs on a tiny hybrid with small batches (so checkpoints sit a few tokens apart), with
prompts of at most a couple of hundred tokens, and reads the server's own counts (``cache_n``), never
its log: a count says what was reused whatever the build logs. The hybrid is the long-memory
Granite-class one: its recurrent state outlasts a prompt, so a state reused from another document
shows in the output (on the tiny Qwen3.5-class hybrid it fades within a hundred tokens). Four servers
run, one after the other: the slot and checkpoint probes without a RAM cache (so no RAM entry
competes with the slot), a slot save with the tiny Qwen3.5-class hybrid's mmproj loaded, the RAM-cache
and LoRA probes with a RAM cache, the sliding-window rules on the tiny Gemma 3-class model (with and without
--swa-full), and the sleep probe with a one-second idle limit (a stall in the other probes must not put their
server to sleep).
"""

from __future__ import annotations

import random
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from reusebench import tiny
from reusebench.capability import Capabilities
from reusebench.llama import binaries, facts, media
from reusebench.llama.binaries import Binary
from reusebench.llama.client import ClientError, Completion, LlamaClient, MediaPrompt, recorded_error
from reusebench.llama.outputs import difference
from reusebench.llama.process import ServerError
from reusebench.llama.server import Server

MMPROJ_MODEL = "qwen35"  # the tiny model with a vision projector
SWA_MODEL = "gemma3"  # sliding-window layers: a 128-token window, 256 window cells at these batch sizes
MODEL = "granitehybrid-longmem"  # recurrent state that outlasts a prompt: a foreign one shows in the output
N_BATCH, N_UBATCH = 64, 16  # end-of-prompt checkpoints 20 and 4 tokens before the end
N_PREDICT = 8  # enough greedy tokens for a foreign state to show
CALL_TIMEOUT_S = 120.0
SLEEP_IDLE_S = 1
DOCUMENT, OTHER, QUESTION = 160, 80, 16  # token counts
ON, OFF = [{"id": 0, "scale": 1.0}], facts.NO_LORA
SLOT_FILE = "capability-probe.bin"
NOT_SUPPORTED = 501  # llama-server's answer to a feature it refuses

Say = Callable[[str], None]


class Words:
    """Token prompts of random words that share nothing with each other but BOS."""

    def __init__(self, client: LlamaClient) -> None:
        self.client = client
        self.bos = client.tokenize("", add_special=True)
        self._random = random.Random(0)

    def text(self, n_words: int) -> str:
        return " ".join(self._random.choice(tiny.WORDS) for _ in range(n_words))

    def tokens(self, n_tokens: int) -> list[int]:
        while True:
            tokens = self.client.tokenize(self.text(n_tokens + 8))[:n_tokens]
            if len(tokens) == n_tokens:
                return tokens

    def prompt(self, *lengths: int) -> list[int]:
        """BOS, then one run of fresh words per length."""
        return self.bos + [t for n in lengths for t in self.tokens(n)]


def first_line(error: BaseException) -> str:
    """An error as one short line, for evidence and ``how``."""
    return (str(error).splitlines() or [""])[0][:300]


def model() -> Path:
    """The probes' model, generated on first use."""
    return tiny.model_path(MODEL)


def _server(binary: Binary, slot_dir: Path, env: Mapping[str, str] | None, *extra: str,
            gguf: Path | None = None) -> Server:
    # One thread: with small batches a thread pool waits at a barrier on every batch, and on a loaded CPU a
    # descheduled thread makes each wait a time slice (50x slower seen with two threads under a build).
    args = ["-m", str(gguf or model()), "-t", "1", "-c", "4096", "-np", "1", "-b", str(N_BATCH), "-ub", str(N_UBATCH),
            "--slot-save-path", str(slot_dir), *extra]
    return Server.of(binary.path, args, env=env, call_timeout_s=CALL_TIMEOUT_S)


def _complete(client: LlamaClient, prompt: Sequence[int] | MediaPrompt, **kwargs: object) -> Completion:
    # No id_slot: a request for a named slot skips the RAM cache. One slot, so it is slot 0 either way.
    return client.complete(prompt, n_predict=N_PREDICT, n_probs=1, **kwargs)  # type: ignore[arg-type]


Found = dict[str, bool | None]
Evidence = dict[str, str]


def _slot_probes(client: LlamaClient, found: Found, evidence: Evidence) -> None:
    words = Words(client)
    _restore(client, words, found, evidence)
    client.slot_erase(0)
    _close_checkpoints(client, words, found, evidence)
    client.slot_erase(0)
    _extension(client, words, found, evidence)
    client.slot_erase(0)
    _user_messages(client, words, found, evidence)


def _ram_probes(client: LlamaClient, found: Found, evidence: Evidence) -> None:
    words = Words(client)
    _empty_slot(client, words, found, evidence)
    _lora(client, words, found, evidence)


def _swa_probes(client: LlamaClient, found: Found, evidence: Evidence) -> None:
    words = Words(client)
    _bounded_search(client, words, found, evidence)
    client.slot_erase(0)
    _window_only_state(client, words, found, evidence)


def probe(binary: Binary, say: Say = lambda _m: None, *, env: Mapping[str, str] | None = None) -> Capabilities:
    """Every capability of `binary`, from four short servers, each stopped also on errors. A server that does not
    start or fails a request (an option or architecture the build lacks) leaves its own capabilities unshown,
    with why."""
    found: Found = {}
    evidence: Evidence = {}
    accepted = binaries.help_options(binary)
    with tempfile.TemporaryDirectory(prefix="reusebench-probe-") as slot_dir:
        servers: list[tuple[str, tuple[str, ...], list[str], Path | None, Callable[..., None]]] = [
            ("slot files, restores and checkpoints",
             ("slot_file_checkpoints", "restore_keeps_slot_checkpoints", "close_checkpoints",
              "extension_returns_to_checkpoint", "user_message_checkpoints", "completion_message_delimiters"),
             ["--cache-ram", "0"], None, lambda h: _slot_probes(h.client, found, evidence)),
            ("slot actions and checkpoints with an mmproj loaded", ("mmproj_slot_actions", "checkpoint_after_image"),
             ["--mmproj", str(tiny.mmproj_path(MMPROJ_MODEL))], tiny.model_path(MMPROJ_MODEL),
             lambda h: _mmproj_probes(h.client, found, evidence)),
            ("the RAM cache, with a LoRA", ("empty_slot_loads_from_ram", "ram_cache_keeps_lora"),
             ["--lora", str(tiny.lora_path(MODEL)), "--cache-ram", "64"], None,
             lambda h: _ram_probes(h.client, found, evidence)),
        ]
        swa_model = tiny.model_path(SWA_MODEL)
        servers.append(("sliding-window rules", ("checkpoint_search_bounded", "swa_state_window_only"),
                        ["--cache-ram", "64"], swa_model, lambda h: _swa_probes(h.client, found, evidence)))
        if "swa-full" in accepted:
            servers.append(("--swa-full", ("swa_full_drops_window",), ["--swa-full", "--cache-ram", "0"], swa_model,
                            lambda h: _swa_full(h.client, Words(h.client), found, evidence)))
        else:
            evidence["swa_full_drops_window"] = "no --swa-full in this build's --help"
        if "sleep-idle-seconds" in accepted:
            servers.append(("what wakes a sleeping server", ("metrics_wakes_sleeping",),
                            ["--metrics", "--sleep-idle-seconds", str(SLEEP_IDLE_S)], None,
                            lambda h: _metrics_wake(h, found, evidence)))
        else:
            evidence["metrics_wakes_sleeping"] = "no --sleep-idle-seconds in this build's --help"
        for what, names, extra, gguf, run in servers:
            say(f"probing {what}")
            try:
                with _server(binary, Path(slot_dir), env, *extra, gguf=gguf) as handle:
                    run(handle)
            except (ServerError, ClientError) as error:
                for name in names:
                    found[name] = None
                    evidence[name] = f"not shown: {type(error).__name__}: {first_line(error)}"
    return Capabilities(**found, evidence=evidence, how="probed")


def _restore(client: LlamaClient, words: Words, found: dict[str, bool | None], evidence: dict[str, str]) -> None:
    """Save D + Q1, fill the slot with another document E, restore the file, re-ask D + Q2.

    The re-ask shares D with the restored tokens. It can reuse only a checkpoint at or before D's end: D + Q1's
    20 tokens before its end when the file carries checkpoints; one of E's when the restore kept the slot's own
    (E is shorter than D, so both of its checkpoints lie inside D: reused, they are another document's state);
    none on a build that drops both.
    """
    document = words.prompt(DOCUMENT)
    first = document + words.tokens(QUESTION)
    _complete(client, first)
    client.slot_save(0, SLOT_FILE)
    other = words.prompt(OTHER, QUESTION)
    _complete(client, other)
    client.slot_restore(0, SLOT_FILE)
    reask = document + words.tokens(QUESTION)
    got = _complete(client, reask)
    reference = _complete(client, reask, cache_prompt=False)
    far, near = facts.end_checkpoint_offsets(N_BATCH, N_UBATCH)
    from_file = len(first) - far
    from_slot = {len(other) - far, len(other) - near}
    compared = difference(got, reference)
    said = (f"saved {len(first)} tokens, another {len(other)}-token document in the slot, restored, re-asked "
            f"{len(reask)} tokens sharing {len(document)}: cache_n={got.cache_n}")
    said += ("; output as without reuse" if compared.identical
             else f"; output differs from no reuse ({compared.describe()})")
    if got.cache_n == from_file:  # the file's replace whatever the slot held: that rule is not shown
        found.update(slot_file_checkpoints=True, restore_keeps_slot_checkpoints=None)
        said += f" (the file's checkpoint at {from_file})"
    elif got.cache_n in from_slot:
        found.update(slot_file_checkpoints=False, restore_keeps_slot_checkpoints=True)
        said += f" (the other document's checkpoint at {got.cache_n})"
    elif got.cache_n == 0:
        found.update(slot_file_checkpoints=False, restore_keeps_slot_checkpoints=False)
    else:
        found.update(slot_file_checkpoints=None, restore_keeps_slot_checkpoints=None)
        said += f" (neither the file's checkpoint at {from_file} nor the other document's at {sorted(from_slot)})"
    evidence["slot_file_checkpoints"] = evidence["restore_keeps_slot_checkpoints"] = said


def _close_checkpoints(client: LlamaClient, words: Words, found: dict[str, bool | None],
                       evidence: dict[str, str]) -> None:
    """A 100-token prompt, resent: the end-of-prompt checkpoints are 16 tokens apart (20 and 4 before the end); a
    build that keeps checkpoints 64 apart has only the first."""
    prompt = words.prompt(99)
    _complete(client, prompt)
    got = _complete(client, prompt).cache_n
    far, near = facts.end_checkpoint_offsets(N_BATCH, N_UBATCH)
    found["close_checkpoints"] = True if got == len(prompt) - near else False if got == len(prompt) - far else None
    evidence["close_checkpoints"] = (f"a {len(prompt)}-token prompt resent: cache_n={got} (checkpoints at "
                                     f"{len(prompt) - far} and {len(prompt) - near})")


def _extension(client: LlamaClient, words: Words, found: Found, evidence: Evidence) -> None:
    """A 100-token prompt and its answer, then all the slot holds (the prompt and the answer but its last token,
    which was sampled and never fed) and 8 words more: kept whole, or back at a checkpoint before the end."""
    prompt = words.prompt(99)
    held = prompt + _complete(client, prompt).tokens[:-1]
    got = _complete(client, held + words.tokens(8)).cache_n
    found["extension_returns_to_checkpoint"] = False if got == len(held) else True if got < len(held) else None
    evidence["extension_returns_to_checkpoint"] = (f"a {len(prompt)}-token prompt and its answer, then the "
                                                   f"{len(held)} tokens the slot holds and 8 more: cache_n={got}")


def _mmproj_probes(client: LlamaClient, found: Found, evidence: Evidence) -> None:
    words = Words(client)
    _mmproj_slot_actions(client, words, found, evidence)
    client.slot_erase(0)
    _checkpoint_after_image(client, words, found, evidence)


def _checkpoint_after_image(client: LlamaClient, words: Words, found: Found, evidence: Evidence) -> None:
    """Words, an image, 4 words; then the same again. The batch of the last 4 tokens is the one right after the
    image: with a checkpoint there the resend keeps all but 4 tokens, without one it goes back before the image."""
    tail = next((text for text in (words.text(4) for _ in range(8)) if len(client.tokenize(text)) == 4), None)
    if tail is None:
        evidence["checkpoint_after_image"] = "could not make a 4-token text to follow the image"
        return
    marker = client.media_marker()
    prompt = MediaPrompt(words.text(N_UBATCH + 64) + marker + tail, (media.generated(0, 0, 32).base64(),))
    total = _complete(client, prompt).prompt_n
    got = _complete(client, prompt).cache_n
    found["checkpoint_after_image"] = True if got == total - 4 else False if got < total - 4 - 16 else None
    evidence["checkpoint_after_image"] = (f"{total} tokens, an image 4 tokens before the end, resent: cache_n={got}")


def _mmproj_slot_actions(client: LlamaClient, words: Words, found: dict[str, bool | None],
                       evidence: dict[str, str]) -> None:
    """A text prompt on a server with an mmproj, then a slot save."""
    _complete(client, words.prompt(40))
    try:
        client.slot_save(0, SLOT_FILE)
    except ClientError as error:
        if error.status != NOT_SUPPORTED:  # a crash or a timeout is no answer about mmproj
            raise
        found["mmproj_slot_actions"] = False
        evidence["mmproj_slot_actions"] = ("saving the slot of a text prompt with an mmproj loaded: "
                                           f"{recorded_error(error)}")
        return
    found["mmproj_slot_actions"] = True
    evidence["mmproj_slot_actions"] = "saving the slot of a text prompt with an mmproj loaded: saved"


def _user_messages(client: LlamaClient, words: Words, found: dict[str, bool | None], evidence: dict[str, str]) -> None:
    """Two user messages; then the same prompt diverging just inside the last one. A checkpoint where the last
    user message starts is all it can reuse: the end-of-prompt ones lie past the divergence."""
    delimiter = client.tokenize(facts.CHATML_USER_START)
    # /completion, the user messages marked with message_delimiters
    head = words.bos + delimiter + words.tokens(40)
    last_user = len(head)
    sent = head + delimiter + words.tokens(100)
    _complete(client, sent, extra=facts.message_delimiters())
    diverging = sent[:last_user + len(delimiter) + 4] + words.tokens(96)
    got = _complete(client, diverging, extra=facts.message_delimiters()).cache_n
    found["completion_message_delimiters"] = _reused_at(got, last_user)
    evidence["completion_message_delimiters"] = (f"/completion with message_delimiters, the last user message at "
                                                 f"token {last_user}, a prompt diverging 4 tokens into it: "
                                                 f"cache_n={got}")
    client.slot_erase(0)
    # /v1/chat/completions: the server finds the user messages itself
    messages = [{"role": "user", "content": words.text(40)}, {"role": "assistant", "content": words.text(10)},
                {"role": "user", "content": words.text(100)}]
    client.chat(messages, n_predict=N_PREDICT, n_probs=1)
    changed = [*messages[:2], {"role": "user", "content": words.text(100)}]
    rendered = client.tokenize(client.apply_template(changed), add_special=True)
    last = max(i for i in range(len(rendered)) if rendered[i:i + len(delimiter)] == delimiter)
    chat, _ = client.chat(changed, n_predict=N_PREDICT, n_probs=1)
    found["user_message_checkpoints"] = _reused_at(chat.cache_n, last)
    evidence["user_message_checkpoints"] = (f"a chat whose last user message (at token {last}) changes from its "
                                            f"first word: cache_n={chat.cache_n}")


def _reused_at(cache_n: int, checkpoint: int) -> bool | None:
    """Whether a prompt returned to the checkpoint at `checkpoint`; None when it reused something else. The first
    user message's checkpoint, right after BOS, is no sign either way."""
    return True if cache_n == checkpoint else False if cache_n <= 1 else None


def _empty_slot(client: LlamaClient, words: Words, found: dict[str, bool | None], evidence: dict[str, str]) -> None:
    """P, then another prompt (P goes to RAM), erase the slot, P again: from RAM it returns to P's checkpoint 4
    tokens before its end; a build that does not look in RAM for an empty slot re-processes it all."""
    prompt = words.prompt(120, QUESTION)
    _complete(client, prompt)
    _complete(client, words.prompt(24))
    client.slot_erase(0)
    got = _complete(client, prompt).cache_n
    found["empty_slot_loads_from_ram"] = _reused_at(got, len(prompt) - facts.end_checkpoint_offsets(N_BATCH, N_UBATCH)[1])
    evidence["empty_slot_loads_from_ram"] = (f"{len(prompt)} tokens, another prompt, the slot erased, the first "
                                             f"again: cache_n={got}")


def _lora(client: LlamaClient, words: Words, found: dict[str, bool | None], evidence: dict[str, str]) -> None:
    """Report B's sequence on one slot: P with the LoRA, Q without (P goes to RAM), P with the LoRA again."""
    conversation = words.prompt(120, QUESTION)
    _complete(client, conversation, lora=ON)
    _complete(client, words.prompt(24), lora=OFF)
    got = _complete(client, conversation, lora=ON).cache_n
    # Kept, it comes back from RAM to its checkpoint 4 tokens before the end; cleared, it starts from nothing.
    found["ram_cache_keeps_lora"] = _reused_at(got, len(conversation) - facts.end_checkpoint_offsets(N_BATCH, N_UBATCH)[1])
    evidence["ram_cache_keeps_lora"] = (f"{len(conversation)} tokens with the LoRA, another prompt without it, then "
                                        f"the first again with it: cache_n={got}")


def _bounded_search(client: LlamaClient, words: Words, found: Found, evidence: Evidence) -> None:
    """A prompt shorter than the window, resent with its last token changed. Everything it shares lies inside the
    window, so the test's threshold is 0 and the window's lowest cell (0) meets it: only a checkpoint helps. The
    bounded search takes the one 4 tokens before the end, which starts at position 0; the other kind finds none
    below 0 and re-processes everything."""
    prompt = words.prompt(99)
    _complete(client, prompt)
    changed = prompt[:-1] + words.tokens(1)
    got = _complete(client, changed).cache_n
    near = len(prompt) - facts.end_checkpoint_offsets(N_BATCH, N_UBATCH)[1] - 1  # a window checkpoint resumes one early
    found["checkpoint_search_bounded"] = True if got == near else False if got == 0 else None
    evidence["checkpoint_search_bounded"] = (f"a {len(prompt)}-token prompt within the 128-token window, resent with "
                                             f"its last token changed: cache_n={got} ({near} from the checkpoint 4 "
                                             f"before the end, 0 without one)")


def _window_only_state(client: LlamaClient, words: Words, found: Found, evidence: Evidence) -> None:
    """P, another prompt (P goes to RAM), then P extended: from RAM, a state that holds only the window must return
    to P's checkpoint 4 tokens before its end; one that kept every cell extends as it is."""
    prompt = words.prompt(400)
    _complete(client, prompt)
    _complete(client, words.prompt(24))
    got = _complete(client, prompt + words.tokens(QUESTION)).cache_n
    near = len(prompt) - facts.end_checkpoint_offsets(N_BATCH, N_UBATCH)[1] - 1
    found["swa_state_window_only"] = True if got == near else False if got == len(prompt) else None
    evidence["swa_state_window_only"] = (f"{len(prompt)} tokens, another prompt, then the first extended: "
                                         f"cache_n={got} ({near} from its checkpoint, {len(prompt)} as it was)")


def _swa_full(client: LlamaClient, words: Words, found: Found, evidence: Evidence) -> None:
    """With --swa-full, a prompt sharing 50 tokens with the last: kept, unless the build still tests them against
    the window (50 < 128), finds no checkpoint (--swa-full makes none) and re-processes everything."""
    prompt = words.prompt(99)
    _complete(client, prompt)
    got = _complete(client, prompt[:50] + words.tokens(50)).cache_n
    found["swa_full_drops_window"] = True if got == 50 else False if got == 0 else None
    evidence["swa_full_drops_window"] = (f"--swa-full, a prompt sharing 50 of {len(prompt)} tokens with the last: "
                                         f"cache_n={got}")


def _metrics_wake(handle: Server, found: dict[str, bool | None], evidence: dict[str, str]) -> None:
    """Idle until /props says asleep, GET /metrics, ask /props again (neither /props call wakes it)."""
    waited = handle.wait_until_asleep(SLEEP_IDLE_S)
    if not waited.asleep:
        found["metrics_wakes_sleeping"] = None
        evidence["metrics_wakes_sleeping"] = f"not asleep after {waited.waited_s:.1f} s idle"
        return
    handle.client.metrics()
    woke = not handle.client.props().get("is_sleeping")
    found["metrics_wakes_sleeping"] = woke
    evidence["metrics_wakes_sleeping"] = (f"asleep after {waited.waited_s:.1f} s idle; after GET /metrics /props says "
                                          f"{'awake' if woke else 'still sleeping'}")
