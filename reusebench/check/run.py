"""Which settings a variant gets checked for, how the server is launched for it, and the run of the probes."""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import replace
from typing import TypeVar

from reusebench.capability import build as build_mod
from reusebench.capability.build import Build
from reusebench.check.context import Probe, ProbeContext, of_kind
from reusebench.check.probes import PROBES, SLEEP_OPTION
from reusebench.check.verdicts import OptionVerdict, Setting, Verdict
from reusebench.config.profiles import OptionValue, Variant
from reusebench.llama import binaries
from reusebench.llama.binaries import HelpOption
from reusebench.llama.client import ClientError, recorded_error
from reusebench.llama.process import ServerError
from reusebench.run import launch
from reusebench.run.launch import LaunchSpec

T = TypeVar("T")

# Defaults checked even when the profile leaves them unset: the ones that decide reuse.
CHECKED_DEFAULTS: tuple[str, ...] = (
    "parallel", "kv-unified", "mmproj", "lora-init-without-apply", "cache-prompt", "ctx-checkpoints",
    "checkpoint-min-step", "slot-prompt-similarity", "cache-idle-slots", "cache-ram", "cache-reuse",
    "slot-save-path", "sleep-idle-seconds",
)
# Long names that set a probed option; True when the name turns it off.
ALIASES: dict[str, tuple[str, bool]] = {
    "no-cache-prompt": ("cache-prompt", True),
    "no-cache-idle-slots": ("cache-idle-slots", True),
    "no-kv-unified": ("kv-unified", True),
    "swa-checkpoints": ("ctx-checkpoints", False),
}
PROBE_CTX_PER_SLOT = 4096  # --ctx-size per slot when the profile sets none; holds every probe prompt
PROBE_TIMEOUT_S = 300.0  # any probe call


def _label(value: OptionValue) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def settings_to_check(variant: Variant, table: Mapping[str, HelpOption] | None = None
                      ) -> list[tuple[Setting, Probe | None]]:
    """The variant's options and the reuse defaults, each with its probe (None: no probe yet), in probe order.

    `table` is the binary's --help (read when not given); the defaults' labels come from it.
    """
    table = binaries.help_table(variant.binary) if table is None else table
    written: dict[str, list[Setting]] = {}
    for name, value in variant.options.items():
        probed, negated = ALIASES.get(name, (name, False))
        written.setdefault(probed, []).append(Setting(name, _label(value), (not value) if negated else value))
    if variant.mmproj is not None:
        written["mmproj"] = [Setting("mmproj", variant.mmproj.name, str(variant.mmproj))]
    if variant.lora:
        written["lora"] = [Setting("lora", ", ".join(path.name for path in variant.lora), len(variant.lora))]
    return in_probe_order(written, lambda probed: Setting(
        probed, f"default ({table[probed].default})" if probed in table and table[probed].default else "not set"))


def in_probe_order(written: dict[str, list[T]], default: Callable[[str], T]) -> list[tuple[T, Probe | None]]:
    """What a variant sets, by probed option, in probe order with the reuse defaults it leaves unset
    (`default` makes those), then what no probe covers."""
    checked: list[tuple[T, Probe | None]] = []
    for probed, probe in PROBES.items():
        settings = written.pop(probed, [])
        if not settings and probed in CHECKED_DEFAULTS:
            settings = [default(probed)]
        checked += [(setting, probe) for setting in settings]
    checked += [(setting, None) for settings in written.values() for setting in settings]
    return checked


def checked_option_names(names: Iterable[str]) -> list[str]:
    """The options ``settings_to_check`` gives for a variant that sets `names` (with "mmproj", "lora" when it
    loads them), without its binary or model: asv's parameters."""
    written: dict[str, list[str]] = {}
    for name in names:
        written.setdefault(ALIASES.get(name, (name, False))[0], []).append(name)
    return [name for name, _ in in_probe_order(written, lambda probed: probed)]


def unsupported_options(variant: Variant, table: Mapping[str, HelpOption]) -> list[OptionVerdict]:
    """Options its binary's --help `table` does not accept as written (``binaries.option_problem``); nothing is
    launched."""
    build = binaries.version(variant.binary)
    found = []
    for name, value in variant.options.items():
        problem = binaries.option_problem(table, name, value)
        if problem is not None:
            evidence = f"`llama-server --help` of build {build}: {problem}"
            found.append(OptionVerdict(name, _label(value), Verdict.UNSUPPORTED, (evidence,)))
    return found


def check_launch(variant: Variant, build: Build) -> LaunchSpec:
    """The check's launch of `variant`: a probe-sized context per slot unless the variant sets one, and /metrics."""
    return launch.resolve(variant, build, context=lambda options: PROBE_CTX_PER_SLOT * options.n_slots, metrics=True)


def launch_args(variant: Variant, build: Build) -> tuple[list[str], list[str]]:
    """(all llama-server arguments, the ones the check adds)."""
    spec = check_launch(variant, build)
    return spec.args, list(spec.added)


class CheckInterrupted(Exception):
    """Ctrl-C or SIGTERM during a check: the verdicts reached, and the settings not probed as UNVERIFIED."""

    def __init__(self, verdicts: list[OptionVerdict]) -> None:
        super().__init__("interrupted")
        self.verdicts = verdicts


INTERRUPTED = "not probed: the check was interrupted (Ctrl-C or SIGTERM)"


def chosen(checked: list[tuple[Setting, Probe | None]], only: Collection[str]) -> list[tuple[Setting, Probe | None]]:
    """The settings `only` names (as written, or the option an alias sets), all without `only`; a name that is not
    among them is a usage error that lists them."""
    if not only:
        return checked
    names = {setting.option: ALIASES.get(setting.option, (setting.option, False))[0] for setting, _ in checked}
    unknown = [name for name in only if name not in names and name not in names.values()]
    if unknown:
        raise ValueError(f"--option {', '.join(unknown)}: not among the options this variant checks "
                         f"({', '.join(names)})")
    return [(s, p) for s, p in checked if s.option in only or names[s.option] in only]


def check_variant(variant: Variant, *, progress: Callable[[str], None] | None = None,
                  build: Build | None = None, only: Collection[str] = ()) -> list[OptionVerdict]:
    """Verdicts for every option `variant` sets and every reuse default (or those `only` names), on its binary's
    `build` (resolved now when not given: ``capability.build.of``); stops every server it starts. Interrupted, it
    raises ``CheckInterrupted`` with what it reached."""
    say = progress or (lambda _message: None)
    try:
        build = build or build_mod.of(variant.binary, say)
    except binaries.BinaryError as error:
        # A binary that cannot even print its --help (SIGILL on this CPU, a missing library) is
        # named in one line, the same for every setting.
        return [setting.verdict(Verdict.UNVERIFIED, f"llama-server did not run: {error}")
                for setting, _ in chosen(settings_to_check(variant, table={}), only)]
    checked = chosen(settings_to_check(variant, build.help), only)
    unsupported = [v for v in unsupported_options(variant, build.help) if any(s.option == v.option for s, _ in checked)]
    if unsupported:
        names = ", ".join(f"--{verdict.option}" for verdict in unsupported)
        rejected = {verdict.option for verdict in unsupported}
        not_run = f"not launched: llama-server refuses to start with {names}"
        return unsupported + [setting.verdict(Verdict.UNVERIFIED, not_run)
                              for setting, _ in checked if setting.option not in rejected]
    verdicts: list[OptionVerdict] = []
    done = 0
    try:
        spec = check_launch(variant, build)
        handle = spec.server(call_timeout_s=PROBE_TIMEOUT_S)
        try:  # closed whatever happens: the server stops and its raw log is deleted
            try:
                ctx = ProbeContext(spec, handle.start())
            except (ServerError, ClientError) as error:
                return [setting.verdict(Verdict.UNVERIFIED, f"llama-server did not start: {error}")
                        for setting, _ in checked]
            started = time.monotonic()
            probes = [probe is not None for _, probe in checked]
            for setting, probe in checked:
                # the probes differ by tens of seconds (a restart, a long prompt): no time is guessed from the
                # first ones, the time spent and the probes left are said
                say(f"[{done + 1}/{len(checked)}] {setting.option}: {'probing' if probe else 'no probe'} "
                    f"({time.monotonic() - started:.0f} s so far, {sum(probes[done + 1:])} probe(s) after this)")
                verdicts += _run_probe(ctx, setting, probe)
                done += 1
            return verdicts
        finally:
            handle.close()
    except KeyboardInterrupt:
        raise CheckInterrupted(verdicts + [setting.verdict(Verdict.UNVERIFIED, INTERRUPTED)
                                           for setting, _ in checked[done:]]) from None


def _run_probe(ctx: ProbeContext, setting: Setting, probe: Probe | None) -> list[OptionVerdict]:
    if probe is None:
        return [setting.verdict(Verdict.UNVERIFIED, "no probe for this option yet")]
    mark = ctx.mark()
    try:
        verdicts = probe(ctx, setting)
    except (ClientError, ServerError, ValueError, KeyError) as error:  # KeyError: a reply without a field
        return [setting.verdict(Verdict.UNVERIFIED, f"probe failed: {type(error).__name__}: {recorded_error(error)}")]
    # A server that fell asleep mid-probe emptied its caches: the probe measured that, not the option.
    if setting.option != SLEEP_OPTION and of_kind(ctx.events_since(mark), "sleep_entering"):
        note = "the server fell asleep during this probe (sleep-idle-seconds), so the result is not trusted"
        return [replace(v, verdict=Verdict.UNVERIFIED, evidence=(note, *v.evidence)) for v in verdicts]
    return verdicts
