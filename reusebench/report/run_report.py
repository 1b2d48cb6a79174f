"""Tables from records: one per profile variant, scenarios down, sizes across.

Works on records read back from JSONL as well as on a run in progress, so a
report can always be rebuilt from ``results/`` alone.
"""

from __future__ import annotations

import json
import textwrap
from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

from tabulate import tabulate

from reusebench.config.sizes import size_label
from reusebench.machine import spread
from reusebench.records import (
    Record,
    Role,
    RunKind,
    StepVerdict,
    deviation,
    drafts,
    images_reprocessed,
    outcome,
    was_interrupted,
)
from reusebench.report import replay_report, run_kinds, service_runs


def correctness(r: Record) -> str:
    """How a verified step's output compares with no reuse: identical, the same within the measured noise band
    (with the band), or DIFFERS."""
    foreign = r.extra.get("foreign_reused")
    note = f"; {foreign:,} tokens reused from another prefix or LoRA" if foreign else ""
    check, delta, band = (r.extra.get(name) for name in ("output_check", "output_delta", "noise_band"))
    if r.matches_reference is None:
        waiting = "not judged: no noise band" if r.mismatch or check is None and delta is not None else "-"
        return waiting + note
    if not r.matches_reference:
        beyond = "" if band is None else f", noise band {band:.2g}"
        return f"DIFFERS ({r.mismatch}{beyond}){note}"
    if check == "within noise":
        return f"same within noise ({delta:.2g}, band {band:.2g}){note}"
    return f"identical{note}"


def cause_words(r: Record) -> str:
    """What the server did with one request and why, in the build's rules: the one sentence the text report, the
    page and ``--json`` give. From the log's structured cause, the prompt's length and where it diverged from
    what the slot held; the log's own summary where these add nothing."""
    c = r.cause or {}
    diverged = r.extra.get("diverges_at")
    at = "" if diverged is None else f" (the prompt diverges at token {diverged:,})"
    ram = "found in the RAM cache, then " if c.get("ram_restored") else ""
    if c.get("woke") or c.get("lora_clear") or c.get("cache_reuse_chunks"):
        return c.get("summary", "")
    if c.get("forced_full") and r.extra.get("slot_from") == "disk":
        return "a slot restored from disk carries no checkpoints: the whole prompt is re-processed"
    if c.get("forced_full"):
        return f"{ram}no checkpoint at or before the divergence{at}: the whole prompt is re-processed"
    checkpoint = c.get("checkpoint_n_tokens")
    if checkpoint is not None and r.prompt_tokens:
        return (f"{ram}returned to the checkpoint {r.prompt_tokens - checkpoint:,} tokens before the end "
                f"(n_tokens={checkpoint:,}){at}")
    return c.get("summary", "")


def _expected(r: Record) -> str:
    """The reuse model's prompt_n, with the deviation when the server did otherwise."""
    if r.expected is None:
        return "not modelled" if r.extra.get("not_modelled") else "-"
    off = deviation(r)
    wrong = ", wrong output" if r.extra.get("expected_wrong_output") else ""
    return f"{r.expected:,}" + (f" ({off:+,}{wrong})" if off else f" ({wrong[2:]})" if wrong else "")


def _cell(r: Record) -> list[Any]:
    if r.error:
        return ["failed", "", "", "", r.error]  # whole: a cut error reads as another number (8211 -> "821")
    return [
        f"{r.prompt_n:,} / {r.ideal:,}",
        _expected(r),
        "n/a (stopped)" if r.prompt_ms is None else f"{r.prompt_ms / 1000:.2f}",  # stopped at its count
        r.verdict or "",
        correctness(r),
    ]


NARROW_WIDTH = 100  # a terminal's: the default of the commands that print a run; report.md is wide
SHORT_OUTPUT = {"identical": "identical", "within noise": "in noise", "WRONG": "WRONG"}
STEP_WIDTH = 24  # a longer step name wraps in its cell


def _narrow(rs: list[Record], width: int) -> str:
    """One table per size that fits `width` columns, then why each step re-processed what it did, wrapped."""
    parts = []
    for size in sorted({r.size for r in rs}):
        measured = [r for r in rs if r.role == Role.MEASURE and r.size == size]
        table = [[f"{r.scenario}/{step_label(r)}", *(["failed", "", "", "", "", ""] if r.error else [
            f"{r.prompt_n:,}", f"{r.ideal:,}", _short_expected(r),
            "-" if r.prompt_ms is None else f"{r.prompt_ms / 1000:.2f}", r.verdict or "",
            SHORT_OUTPUT.get(str(r.extra.get("output_check")), "-")])] for r in measured]
        parts.append(f"{size_label(size)}\n" + tabulate(
            table, ["step", "re-processed", "ideal", "expected", "s", "verdict", "output"],
            tablefmt="simple", disable_numparse=True, maxcolwidths=[STEP_WIDTH, None, None, None, None, None, None]))
    largest = {(r.scenario, step_label(r)): r for r in sorted(rs, key=lambda r: r.size) if r.role == Role.MEASURE}
    why = [textwrap.fill(f"{scenario}/{step}: {cause_words(r) or '-'}"
                         + (f" (model: {r.cause_expected})" if r.cause_expected else ""), width,
                         subsequent_indent="    ") for (scenario, step), r in largest.items()]
    legend = textwrap.fill("s: prompt seconds, - for a step stopped at its count; output: against no reuse (in noise: "
                           "within the noise of batch shapes); expected: the reuse model's, wrong where it knows the "
                           "reused state to be foreign, n/m where it does not model the memory", width)
    return ("\n\n".join(parts) + _images(rs) + _speculation(rs) + f"\n\n{legend}\n\nwhy (largest size; the reuse model's in brackets):\n"
            + "\n".join(why))


def image_cells(r: Record) -> list[str]:
    """A step with images: the images sent, those after what the step kept (re-processed: whole, as one chunk) and
    their tokens, the images the server encoded (its log: equal to the re-processed unless it holds an encoding;
    "-" for a step stopped at its count, which ends before its images), and the seconds the encodes took; blanks
    without images."""
    spans = r.extra.get("image_spans") or []
    if not spans:
        return ["", "", "", ""]
    again = images_reprocessed(r)
    cause = r.cause or {}
    encoded, encode_ms = cause.get("images_encoded"), cause.get("image_encode_ms")
    if r.prompt_ms is None:  # stopped at its count
        return [f"{len(again)} / {len(spans)}", f"{sum(again):,}", "-", "-"]
    return [f"{len(again)} / {len(spans)}", f"{sum(again):,}", "?" if encoded is None else str(encoded),
            "-" if not encode_ms else f"{encode_ms / 1000:.3f}"]


IMAGE_HEADERS = ["images re-processed / sent", "their tokens", "encoded (log)", "encode s"]


def _images(rs: list[Record]) -> str:
    """The images of each step at the largest size: "" when no step sent one."""
    with_images = [r for r in rs if r.role == Role.MEASURE and r.extra.get("image_spans") and not r.error]
    if not with_images:
        return ""
    size = max(r.size for r in with_images)
    table = [[f"{r.scenario}/{step_label(r)}", *image_cells(r)] for r in with_images if r.size == size]
    return (f"\n\nimages at {size_label(size)} (encoded: - for a step stopped at its count)\n"
            + tabulate(table, ["step", *IMAGE_HEADERS], tablefmt="simple", disable_numparse=True))


SPECULATION_HEADERS = ["step", "drafted", "accepted", "drafts", "rolled back", "from a checkpoint", "decode ms/token"]


def _speculation(rs: list[Record], fmt: str = "simple") -> str:
    """What a speculating launch drafted for each step's answer at the largest size: tokens drafted and accepted
    (the server's timings), drafts verified, those with a token rejected (each a rollback of the state) and of them
    those undone from a speculative checkpoint (its log), and the decode time per generated token; "" when the
    launch does not speculate."""
    drafting = [r for r in rs if r.role == Role.MEASURE and r.extra.get("draft_n") is not None and not r.error]
    if not drafting:
        return ""
    size = max(r.size for r in drafting)
    table = []
    for r in (r for r in drafting if r.size == size):
        known = drafts(r)
        logged = ["?"] * 3 if known is None else [str(known.verified), str(known.rolled_back),
                                                   str(known.from_checkpoint)]
        table.append([f"{r.scenario}/{step_label(r)}", f"{r.extra['draft_n']:,}", f"{r.extra.get('draft_accepted', 0):,}",
                      *logged,
                      "-" if not (r.predicted_ms and r.predicted_n) else f"{r.predicted_ms / r.predicted_n:.2f}"])
    return (f"\n\nspeculation at {size_label(size)} (drafts: the log's; ? where the server logged none)\n"
            + tabulate(table, SPECULATION_HEADERS, tablefmt=fmt, disable_numparse=True))


def _short_expected(r: Record) -> str:
    if r.expected is None:
        return "n/m" if r.extra.get("not_modelled") else "-"
    return f"{r.expected:,}" + (" wrong" if r.extra.get("expected_wrong_output") else "")


def variant_tables(records: Iterable[Record], width: int | None = None) -> list[tuple[str, str]]:
    """[(title, table text)] for each profile variant, in the order first seen: one wide table with every column
    (`width` None: report.md, --wide), else tables that fit `width` columns."""
    records = list(records)
    groups: dict[tuple[str, str], list[Record]] = defaultdict(list)
    for r in records:
        groups[(r.profile, r.variant)].append(r)
    out = []
    for (profile, variant), rs in groups.items():
        if width is not None:
            out.append((f"{profile} [{variant}] ({', '.join(r.model for r in rs[:1])})",
                        _narrow(rs, width) + "\n\n" + _footer(rs, width)))
            continue
        sizes = sorted({r.size for r in rs})
        rows: dict[tuple[str, str], dict[int, Record]] = {}
        for r in rs:
            if r.role == Role.MEASURE:
                rows.setdefault((r.scenario, step_label(r)), {})[r.size] = r
        header = ["scenario", "step"]
        images = any(r.extra.get("image_spans") for r in rs)
        for size in sizes:
            label = size_label(size)
            header += [f"{label} re-processed / ideal", f"{label} expected", f"{label} prompt s", f"{label} verdict",
                       f"{label} output"]
            header += [f"{label} {h}" for h in IMAGE_HEADERS] if images else []
        header += ["why (largest size)", "model's why (largest size)"]
        table = []
        for (scenario, step), by_size in rows.items():
            line: list[Any] = [scenario, step]
            for size in sizes:
                line += _cell(by_size[size]) if size in by_size else ["", "", "", "", ""]
                line += (image_cells(by_size[size]) if size in by_size else [""] * 4) if images else []
            largest = by_size[max(by_size)]
            line += [cause_words(largest), largest.cause_expected or ""]
            table.append(line)
        out.append((f"{profile} [{variant}] ({', '.join(r.model for r in rs[:1])})",
                    tabulate(table, header, tablefmt="github", disable_numparse=True) + _speculation(rs, "github")
                    + "\n\n" + _footer(rs)))
    return out


def step_label(r: Record) -> str:
    repeat = r.extra.get("repeat")
    return r.step if repeat is None else f"{r.step} (repeat {repeat})"


def repeat_tables(records: Iterable[Record]) -> list[tuple[str, str]]:
    """[(title, table text)] for each variant x size with repeated first loads: the spread beside each repeat's state."""
    return [(f"first-load repeats: {profile} [{variant}] @ {size_label(size)}", spread.render(repeats))
            for (_, profile, variant, size), repeats in spread.first_load_repeats(records).items()]


def _footer(rs: list[Record], width: int | None = None) -> str:
    """The run's build, its setup and reference prefills and its miss rates, lines wrapped at `width`."""
    text = _footer_lines(rs)
    if width is None:
        return text
    return "\n".join(textwrap.fill(line, width, subsequent_indent="    ") for line in text.splitlines())


def _footer_lines(rs: list[Record]) -> str:
    setup = [r for r in rs if r.role == Role.SETUP and r.prompt_n is not None]
    refs = [r for r in rs if r.role == Role.REFERENCE]
    builds = sorted({r.build for r in rs})
    by_step: dict[str, list[str]] = defaultdict(list)  # one entry per step, its sizes side by side
    for r in setup:
        by_step[f"{r.scenario}/{r.step}"].append(f"{r.prompt_n:,}")
    setup_calls = "; ".join(f"{step} {' / '.join(counts)}" for step, counts in by_step.items())
    return "\n".join((
        f"build {', '.join(builds)}",
        f"setup prefills (not measured): {len(setup)}, {sum(r.prompt_n or 0 for r in setup):,} tokens re-processed"
        + (f" ({setup_calls})" if setup else ""),
        f"reference prefills for correctness: {len(refs)} ({sum(r.prompt_n or 0 for r in refs):,} tokens, "
        f"{sum(r.prompt_ms or 0 for r in refs) / 1000:.1f} s)",
        miss_rates(rs),
    ))


def miss_rates(records: Iterable[Record]) -> str:
    """Misses with honest denominators (report B): turns that cannot hit are counted apart from turns that should."""
    measured = [r for r in records if r.role == Role.MEASURE and not r.error]
    should = [r for r in measured if r.expected_hit is not False]  # unknown (older records) counts as should
    cannot = [r for r in measured if r.expected_hit is False]
    missed = sum(outcome(r) == StepVerdict.MISS for r in should)
    all_full = sum(not r.cache_n for r in measured)  # a fact, not an outcome: what report B's single rate counted
    wrong = sum(r.matches_reference is False for r in measured)
    unexpected = [r for r in measured if r.verdict == StepVerdict.UNEXPECTED]
    foreign = sum(bool(r.extra.get("foreign_reused")) for r in measured)
    not_modelled = dict.fromkeys(str(r.extra["not_modelled"]) for r in measured if r.extra.get("not_modelled"))
    return "\n".join((*plainly(records),
        f"miss rate of turns that should hit: {missed} of {len(should)} re-processed everything "
        f"({_percent(missed, len(should))}), {sum(outcome(r) == 'partial' for r in should)} partial",
        f"turns that cannot hit, counted apart: {len(cannot)}"
        + (f" ({', '.join(dict.fromkeys(f'{r.scenario}/{r.step}' for r in cannot))})" if cannot else ""),
        f"all turns in one denominator (misleading): {all_full} of {len(measured)} ({_percent(all_full, len(measured))})",
        f"wrong output: {wrong}; reused state computed for another prefix or LoRA: {foreign}",
        f"steps the reuse model did not expect: {len(unexpected)}"
        + (f" ({', '.join(f'{r.scenario}/{r.step}' for r in unexpected)})" if unexpected else ""),
        *(f"not modelled, no expected counts: {why}" for why in not_modelled),
    ))


def unverified(r: Record) -> bool:
    """A measured step that reused something and whose output no no-reuse reference judged (yet)."""
    return r.role == Role.MEASURE and not r.error and bool(r.cache_n) and r.matches_reference is None


def plainly(records: Iterable[Record]) -> list[str]:
    """What a reader must not miss: a run cut short, reused outputs left unjudged, and outputs the reuse model
    predicts to be wrong (beside what the reference said); nothing when none of these holds."""
    rs = list(records)
    cut = [r for r in rs if was_interrupted(r.error)]
    open_steps = [f"{r.scenario}/{r.step}" for r in rs if unverified(r)]
    predicted = [r for r in rs if r.role == Role.MEASURE and r.extra.get("expected_wrong_output")]
    lines = []
    if cut:
        lines.append(f"CUT SHORT: {cut[0].error} at {cut[0].scenario}/{cut[0].step}; what it measured is kept")
    if open_steps:
        lines.append(f"UNVERIFIED: {len(open_steps)} reused output(s) not judged against a no-reuse reference "
                     f"({', '.join(open_steps)})")
    if predicted:
        said = ", ".join(f"{r.scenario}/{r.step} (measured: {r.extra.get('output_check') or 'not judged'})"
                         for r in predicted)
        lines.append(f"wrong output predicted by the reuse model: {len(predicted)} ({said})")
    return lines


def _percent(part: int, whole: int) -> str:
    return f"{100 * part / whole:.0f}%" if whole else "n/a"


def render_text(records: Iterable[Record], width: int | None = None,
                kinds: Mapping[str, RunKind] | None = None) -> str:
    """Scenario runs as tables (`width`: that fit so many columns; None: every column), workload and tap runs as
    service reports, trace replays as theirs: each run by its kind (`kinds`, from run.json; else from its
    records)."""
    records = list(records)
    kind = run_kinds.by_run_id(records, kinds)
    scenario_records = [r for r in records if kind[r.run_id] is RunKind.SCENARIOS]
    tables = variant_tables(scenario_records, width) + repeat_tables(scenario_records)
    for run_id in dict.fromkeys(r.run_id for r in records if kind[r.run_id] is not RunKind.SCENARIOS):
        one = [r for r in records if r.run_id == run_id]
        render = replay_report.render if kind[run_id] is RunKind.REPLAY else service_runs.render_runs
        tables.append((f"{kind[run_id].value} run {run_id}", render(one)))
    return "\n\n".join(f"## {title}\n\n{table}" for title, table in tables)


def _rollbacks(r: Record) -> dict[str, int | None]:
    """A speculating step's drafts with a token rejected and, of them, those undone from a speculative checkpoint
    rather than rolled back in place (None where unknown)."""
    known = drafts(r)
    return {"drafts_rolled_back": None if known is None else known.rolled_back,
            "spec_checkpoints_restored": None if known is None else known.from_checkpoint}


def summary_json(records: Iterable[Record]) -> str:
    """Measured steps as JSON (for machines): counts, times, verdicts and causes, no text."""
    keep = ("session", "profile", "variant", "build", "size", "scenario", "step", "prompt_tokens", "prompt_n",
            "cache_n", "ideal", "excess", "expected", "cause_expected", "prompt_ms", "ttft_ms", "wall_ms", "verdict", "matches_reference",
            "mismatch", "expected_hit", "error")
    checks = ("output_check", "output_delta", "noise_band", "repeat", "expected_wrong_output", "not_modelled", "draft_n",
              "draft_accepted")
    rows = [{k: getattr(r, k) for k in keep} | {"cause": cause_words(r) or None} | {k: r.extra.get(k) for k in checks}
            | _rollbacks(r)
            | {"unverified": unverified(r), "cut_short": was_interrupted(r.error)}
            for r in records if r.role == Role.MEASURE]
    return json.dumps(rows, indent=2)
