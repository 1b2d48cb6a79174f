"""The probe of image reuse with an mmproj loaded: does the server encode an image it already holds again?

llama-server holds an image as one chunk of the slot's prompt, matched whole by the image's id. A resend keeps it;
a prompt that changes after it keeps it only where the memory can be cut there: a hybrid returns to a checkpoint,
and b11434 makes no checkpoint for the batch right after an image ("do not checkpoint after mtmd chunks",
server-context.cpp), so a re-ask whose image sits within the last 4 + n_ubatch tokens returns to the checkpoint before
the image and encodes it again. The log says what was encoded ("encoding mtmd batch ... n_chunks = N"); the output of
the resend is compared with the same prompt computed without reuse.
"""

from __future__ import annotations

from reusebench.check.context import QUESTION_TOKENS, ProbeContext, of_kind, quote
from reusebench.check.probes.launch import probe_mmproj
from reusebench.check.verdicts import OptionVerdict, Setting, Verdict
from reusebench.llama import media
from reusebench.llama.client import MediaPrompt
from reusebench.llama.logs import Event

IMAGE_SIDE = 64  # any projector resizes it to its own input


def probe_mmproj_and_images(ctx: ProbeContext, setting: Setting) -> list[OptionVerdict]:
    """The mmproj loaded (``probe_mmproj``), then, when it reads images, whether image reuse is in effect."""
    loaded = probe_mmproj(ctx, setting)
    if loaded[0].verdict is not Verdict.ACTIVE or not ctx.client.props().get("modalities", {}).get("vision"):
        return loaded
    return [*loaded, *probe_image_reuse(ctx, setting)]


def probe_image_reuse(ctx: ProbeContext, setting: Setting) -> list[OptionVerdict]:
    marker = ctx.client.media_marker()
    image = media.generated(0, 0, IMAGE_SIDE)
    document = ctx.client.detokenize(ctx.fresh(ctx.doc_tokens))
    first, second = (ctx.client.detokenize(q) for q in ctx.questions())

    def prompt(question: str) -> MediaPrompt:
        return MediaPrompt(f"{document}{marker}{question}", (image.base64(),))

    cold = ctx.complete(prompt(first))
    mark = ctx.mark()
    resend = ctx.complete(prompt(first))
    resend_events = ctx.events_since(mark)
    reference = ctx.complete(prompt(first), cache_prompt=False)
    outcome, output = ctx.output_check(resend, reference, prompt(first))
    ctx.complete(prompt(first))  # the slot holds the prompt again, as after the resend
    mark = ctx.mark()
    reask = ctx.complete(prompt(second))
    reask_events = ctx.events_since(mark)
    what = (f"a {cold.prompt_n:,}-token prompt with one {IMAGE_SIDE} px image {QUESTION_TOKENS} tokens before its "
            "end")
    resend_verdict = Verdict.UNSAFE if outcome == "WRONG" else _verdict(resend_events)
    return [
        setting.verdict(resend_verdict, f"{what}, sent again: {_encoded(resend_events)}",
                        f"cache_n={resend.cache_n} prompt_n={resend.prompt_n}", *_quoted(resend_events),
                        f"output: {output}", aspect="image on a resend"),
        setting.verdict(_verdict(reask_events), f"{what}, asked again with another question after the image: "
                        f"{_encoded(reask_events)}", f"cache_n={reask.cache_n} prompt_n={reask.prompt_n}",
                        *_quoted(reask_events), *_why(reask_events), aspect="image before a re-ask"),
    ]


def _n_encoded(events: list[Event]) -> int:
    return sum(int(e.fields["n_chunks"]) for e in of_kind(events, "mtmd_encoding"))


def _verdict(events: list[Event]) -> Verdict:
    return Verdict.INEFFECTIVE if _n_encoded(events) else Verdict.ACTIVE


def _encoded(events: list[Event]) -> str:
    n = _n_encoded(events)
    return "the image was encoded again" if n else "no image was encoded (the server kept the one it holds)"


def _quoted(events: list[Event]) -> list[str]:
    return [quote(e) for e in of_kind(events, "checkpoint_restored", "forced_full_reprocess", "mtmd_encoding")]


def _why(events: list[Event]) -> list[str]:
    if not _n_encoded(events) or not of_kind(events, "checkpoint_restored"):
        return []
    return ["the checkpoint it returned to lies before the image: none is made right after an image "
            "(docs/llama-server-reuse.md, images)"]
