"""The harness itself: how much it costs beyond what it measures.

From the same run as every other module (``common.SessionFigures``: one run per commit),
read back from its records: each session ends with a summary record (role "session")
that holds its timing and the prompt tokens it made the server prefill, by role.

- **Prefill budget**: all prompt tokens the session made the server prefill (setup,
  measured and reference calls; a step stopped once its count was known adds only what
  it prefilled before the cancel) over what the measured steps re-processed. Tracked as
  the ratio (dimensionless, lower is better, comparable across sizes, and it is the
  figure the targets are set in: at most 1.25 with verification, 1.05 without), as the
  extra tokens themselves (setup + reference: what the ratio costs at this size), and in
  documents of the session's size (report A's 128K session: 4 with early stop, 6 without).
- **Harness overhead**: session wall time minus the server's prompt and generation
  time, model loads, restarts and stops, and deliberate waits (sleep scenarios); in
  seconds and as a percentage of the session (target: under 3%).
- **Client TTFT - server prompt time**: the median per request (loopback target: 5 ms).
- **Corpus building**: seconds and tokenizer calls for the session's documents (two
  documents of the session's size; target for one 128K document: 2 s and 5 calls).

Seconds, tokens, counts and lower-is-better ratios only (asv takes lower as better);
medians over repeats (``REUSEBENCH_ASV_REPEAT``).
"""

from __future__ import annotations

import functools
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

from asv_runner.benchmarks.mark import SkipNotImplemented

from reusebench import budget, records
from reusebench.config import sizes

from . import common


@functools.lru_cache(maxsize=4)
def _read(paths: tuple[str, ...]) -> list[records.Record]:
    return [r for path in paths for r in records.read_records(Path(path))]


def _session_records(cache: dict[str, Any], size: str, variant: str) -> list[records.Record]:
    return [r for r in _read(tuple(cache["records"])) if r.variant == variant and sizes.size_label(r.size) == size]


def summary_figure(cache: dict[str, Any], size: str, variant: str, value: Callable[[records.Record], float]) -> float:
    """The median over the sessions' summary records of ``value(record)``."""
    summaries = [r for r in _session_records(cache, size, variant) if r.role == records.Role.SESSION]
    if not summaries:
        if (variant, size) in cache["clean_sessions"] or not _session_records(cache, size, variant):
            raise SkipNotImplemented(f"no session summary for {variant} @ {size} (records from before summaries)")
        raise RuntimeError(f"no session summary for {variant} @ {size}: {cache['errors'].get((variant, size), '')}")
    return statistics.median(value(summary) for summary in summaries)


def summary_track(value: Callable[[records.Record], float], unit: str,
                  doc: str | None = None) -> Callable[..., float]:
    """A ``track_*`` method (params: size, variant, through ``common.track``) of ``summary_figure`` of ``value``."""
    return common.track(lambda cache, size, variant, _step: summary_figure(cache, size, variant, value), "summary",
                        unit=unit, doc=doc)


def prefill_budget(summary: records.Record) -> budget.PrefillBudget:
    return budget.PrefillBudget.of("", summary.extra["prefill"], summary.size)


def budget_ratio(summary: records.Record) -> float:
    ratio = prefill_budget(summary).ratio
    if ratio is None:
        raise RuntimeError("no measured prefill: the session failed before its first measured step")
    return ratio


class PrefillBudget(common.SessionFigures):
    """Prompt tokens prefilled per session against what the measured steps re-processed: setup and no-reuse
    references add to it, steps stopped once their count was known take from it."""

    params = (common.SIZES, common.VARIANTS)
    param_names = ["size", "variant"]
    version = "2"  # 2: the tokens the server really prefilled (a step stopped early prefills a part)

    track_prefill_budget_ratio = summary_track(
        budget_ratio, "ratio", "All prefilled prompt tokens over what the measured steps re-processed.")
    track_extra_prefill_tokens = summary_track(
        lambda r: prefill_budget(r).extra, "tokens",
        "Setup and reference prompt tokens: what verification and preconditions cost.")
    track_documents_prefilled = summary_track(
        lambda r: prefill_budget(r).documents, "documents",
        "All prefilled prompt tokens in documents of the session's size: its full prefills' worth.")


class HarnessOverhead(common.SessionFigures):
    """Time the harness spends beyond the server's own work."""

    params = (common.SIZES, common.VARIANTS)
    param_names = ["size", "variant"]
    version = "1"

    track_overhead_seconds = summary_track(
        lambda r: r.extra["timing"]["overhead_s"], "seconds",
        "Session wall time minus server prompt/generation time, loads/restarts/stops and deliberate waits.")
    track_overhead_percent = summary_track(
        lambda r: 100 * r.extra["timing"]["overhead_s"] / r.extra["timing"]["wall_s"], "percent",
        "The same as a percentage of the session's wall time (target: under 3).")

    def track_ttft_minus_prompt_seconds(self, cache, size, variant):
        """Median over the session's completions of client TTFT minus the server's prompt time."""
        gaps = [(r.ttft_ms - r.prompt_ms) / 1000 for r in _session_records(cache, size, variant)
                if r.ttft_ms is not None and r.prompt_ms is not None and not r.error]
        if not gaps:
            return common.figure(cache, size, variant, common.FIRST_LOAD, "ttft_seconds")  # fails or skips as it does
        return statistics.median(gaps)

    track_ttft_minus_prompt_seconds.unit = "seconds"


class CorpusBuilding(common.SessionFigures):
    """Building the session's documents of exact token size with the server's tokenizer (two documents)."""

    params = (common.SIZES, common.VARIANTS)
    param_names = ["size", "variant"]
    version = "1"

    track_corpus_seconds = summary_track(lambda r: r.extra["timing"]["corpus_s"], "seconds")
    track_corpus_tokenizer_calls = summary_track(lambda r: r.extra["timing"]["corpus_tokenizer_calls"], "calls")
