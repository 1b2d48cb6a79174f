"""What the tap costs: the time to first token it adds per request, and its tokenization per 1K prompt tokens.

Starts the pinned llama-server on the tiny GLM-class hybrid and a tap in front of it, then:

- sends the same short streamed ``/completion`` (no reuse: ``cache_prompt`` false, so every prefill is equal)
  directly and through the tap, in alternating pairs; the added TTFT is each pair's difference, as p50 and p90;
- sends chat prompts of 1K to 16K tokens through the tap, whose records hold what ``/apply-template`` and
  ``/tokenize`` took, per 1K tokens.

    .venv/bin/python tools/tap_overhead.py [--pairs 200]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import httpx

from reusebench import records, tiny
from reusebench.llama import binaries
from reusebench.llama.process import ServerProcess
from reusebench.records import Role
from reusebench.tap import Tap, TapOptions


def words(start: int, n: int) -> str:
    return " ".join(tiny.WORDS[(start + 7 * i) % len(tiny.WORDS)] for i in range(n))


def ttft_ms(client: httpx.Client, body: dict) -> float:
    started = time.perf_counter()
    with client.stream("POST", "/completion", json=body) as response:
        for line in response.iter_lines():
            if line.startswith("data:") and '"tokens"' in line and "prompt_progress" not in line:
                return (time.perf_counter() - started) * 1000.0
    raise RuntimeError("no token came")


def percentile(values: list[float], q: int) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=200)
    args = parser.parse_args()
    binary = binaries.resolve_binary("default", source="tools/tap_overhead.py").path
    model = tiny.model_path("glm5-next")
    with tempfile.TemporaryDirectory() as tmp, ServerProcess(binary, ("-m", str(model), "-c", "20480", "-np", "1"),
                                                           log_verbosity=4) as server:
        tap = Tap(TapOptions(upstream=server.base_url, listen=("127.0.0.1", 0), results=Path(tmp) / "results",
                             key_file=Path(tmp) / "tap.key", server_log=server.raw_log_path))
        url = tap.start()
        auth = {"Authorization": f"Bearer {server.api_key}"}
        body = {"prompt": words(1, 64), "n_predict": 2, "stream": True, "cache_prompt": False, "temperature": 0}
        added = []
        with httpx.Client(base_url=server.base_url, headers=auth, timeout=60) as direct, \
                httpx.Client(base_url=url, headers=auth, timeout=60) as relayed:
            for _ in range(5):  # warm both paths
                ttft_ms(direct, body), ttft_ms(relayed, body)
            for pair in range(args.pairs):
                if pair % 2:  # alternate which goes first
                    a = ttft_ms(direct, body)
                    b = ttft_ms(relayed, body)
                else:
                    b = ttft_ms(relayed, body)
                    a = ttft_ms(direct, body)
                added.append(b - a)
            for n in (1024, 4096, 16384):
                chat = {"messages": [{"role": "user", "content": words(n, n - 16)}], "max_tokens": 1,
                        "cache_prompt": False}
                assert relayed.post("/v1/chat/completions", json=chat).status_code == 200
        tap.stop("measured")
        kept = records.read_records(tap.run_dir.records_path)
    print(f"added TTFT through the tap over {args.pairs} pairs of a 65-token streamed /completion: "
          f"p50 {percentile(added, 50):.2f} ms, p90 {percentile(added, 90):.2f} ms")
    for r in kept:
        if r.role == Role.MEASURE and r.endpoint == "/v1/chat/completions" and r.prompt_tokens:
            per_1k = r.extra["tokenize_ms"] / r.prompt_tokens * 1000
            print(f"chat prompt of {r.prompt_tokens:,} tokens: /apply-template + /tokenize {r.extra['tokenize_ms']:.1f} ms,"
                  f" {per_1k:.2f} ms per 1K tokens; prefill {r.prompt_ms:.0f} ms")


if __name__ == "__main__":
    main()
