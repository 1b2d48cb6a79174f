"""The tap under load: many clients at once through `reusebench tap` to a real llama-server, nothing lost.

Starts the pinned llama-server on the tiny llama (4 slots) and `reusebench tap` in front of it, as a process of
its own (its peak RSS is the kernel's VmHWM), then runs `--clients` threads that send `--requests` short
``/completion`` requests in all, half with token ids and half with text (which the tap tokenizes through the
server), first straight to the server and then through the tap, the same requests in the same order. Prints the
requests relayed, the records written, the requests lost (relayed but not recorded: must be 0), the latency the
tap adds at p50 and p90 (through-tap minus direct, request by request) and the tap's peak RSS.

    .venv/bin/python tools/tap_load.py [--clients 16] [--requests 2000]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from reusebench import listening, records, tiny
from reusebench.llama import binaries
from reusebench.llama.process import ServerProcess, free_port
from reusebench.records import Role

REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Load:
    relayed: int  # answered 200 through the tap
    recorded: int  # records of those requests in the tap's records.jsonl
    summary_requests: int  # what the tap's summary counted
    added_ms: list[float]  # per request, through the tap minus straight to the server
    peak_rss_mib: float
    seconds: float
    # what was not a plain 200: the client's statuses or error classes, and the tap's records' errors (fixed words)
    not_ok: Counter[str] = field(default_factory=Counter)
    record_errors: Counter[str] = field(default_factory=Counter)

    @property
    def lost(self) -> int:
        return self.relayed - self.recorded

    def lines(self) -> list[str]:
        q = statistics.quantiles(self.added_ms, n=10, method="inclusive")
        return [f"requests relayed: {self.relayed:,}; records written: {self.recorded:,}; lost: {self.lost}",
                f"latency added by the tap: p50 {statistics.median(self.added_ms):.1f} ms, p90 {q[8]:.1f} ms",
                f"tap peak RSS: {self.peak_rss_mib:.0f} MiB; {self.seconds:.0f} s in all",
                *([f"not answered 200: {dict(self.not_ok)}"] if self.not_ok else []),
                *([f"records with an error: {dict(self.record_errors)}"] if self.record_errors else [])]


def body(n: int) -> dict[str, object]:
    """Request `n`: a short prompt, ids or text, never the same twice in a row on a slot."""
    if n % 2:
        return {"prompt": [1, *range(100 + n % 97, 140 + n % 97)], "n_predict": 1, "temperature": 0}
    return {"prompt": " ".join(tiny.WORDS[(n * 7 + i) % len(tiny.WORDS)] for i in range(30)), "n_predict": 1,
            "temperature": 0}


def send_all(url: str, key: str, clients: int, requests: int) -> list[tuple[int | str, float]]:
    """Every request's (status, milliseconds), by request number; `clients` threads share the numbers. A request
    that got no answer has its error's class for a status, and its client goes on with the next number."""
    results: list[tuple[int | str, float]] = [("not sent", 0.0)] * requests
    numbers = iter(range(requests))
    lock = threading.Lock()

    def client() -> None:
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=120) as http:
            while True:
                with lock:
                    n = next(numbers, None)
                if n is None:
                    return
                started = time.perf_counter()
                status: int | str
                try:
                    status = http.post("/completion", json=body(n)).status_code
                except httpx.HTTPError as exc:
                    status = type(exc).__name__
                results[n] = (status, (time.perf_counter() - started) * 1000.0)

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def run(clients: int = 16, requests: int = 2000, tmp: Path | None = None) -> Load:
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as scratch:
        work = tmp or Path(scratch)
        binary = binaries.resolve_binary("default", source="tools/tap_load.py").path
        with ServerProcess(binary, ("-m", str(tiny.model_path("llama")), "-c", "8192", "-np", "4"),
                           log_verbosity=4) as server:
            port = free_port()
            tap = subprocess.Popen(
                [sys.executable, "-m", "reusebench", "tap", "--upstream", server.base_url, "--listen",
                 f"127.0.0.1:{port}", "--server-log", str(server.raw_log_path), "--results", str(work / "results"),
                 "--key-file", str(work / "tap.key"), "--max-connections", str(2 * clients)],
                cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
            try:
                url = f"http://127.0.0.1:{port}"
                if not listening.wait_listening(url + "/health", lambda: tap.poll() is None):
                    raise RuntimeError("the tap did not start")
                direct = send_all(server.base_url, server.api_key, clients, requests)
                through = send_all(url, server.api_key, clients, requests)
                rss = peak_rss_mib(tap.pid)
            finally:
                tap.terminate()
                tap.wait(timeout=60)
        (run_dir,) = (work / "results" / "runs").iterdir()
        kept = records.read_records(run_dir / "records.jsonl")
    answered = [r for r in kept if r.role in (Role.MEASURE, Role.PROBE)]
    calls = [r for r in answered if r.status == 200 and not r.error]
    (summary,) = [r for r in kept if r.role == Role.SESSION]
    return Load(relayed=sum(status == 200 for status, _ in through), recorded=len(calls),
                summary_requests=summary.extra["requests"],
                added_ms=[t - d for (_, t), (_, d) in zip(through, direct)], peak_rss_mib=rss,
                seconds=time.monotonic() - started,
                not_ok=Counter(f"{phase}: {status}" for phase, sent in (("direct", direct), ("through the tap", through))
                               for status, _ in sent if status != 200),
                record_errors=Counter(f"{r.status}: {r.error}" for r in answered if r.error or r.status != 200))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--requests", type=int, default=2000)
    args = parser.parse_args()
    print("\n".join(run(args.clients, args.requests).lines()))


if __name__ == "__main__":
    main()
