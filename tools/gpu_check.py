"""One-command check of the GPU sampler on a machine with an NVIDIA GPU.

    python tools/gpu_check.py --server path/to/llama-server --model path/to/model.gguf

Samples a few idle seconds, then starts llama-server (built with CUDA) on the model and sends one
short prefill, and prints what the sampler saw in each phase. Exits 2 without a GPU, 1 if the
server fails.
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout, installed or not

from reusebench.gpu import GpuSampler, StepGpuSummary  # noqa: E402
from reusebench.host import capture  # noqa: E402

SENTENCE = "The quick brown fox jumps over the lazy dog while the clock on the wall keeps ticking. "


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--server", type=Path, required=True, help="llama-server binary built with CUDA")
    parser.add_argument("--model", type=Path, required=True, help="GGUF model")
    parser.add_argument("--idle-s", type=float, default=3.0, help="seconds sampled before the server starts")
    parser.add_argument("--prompt-sentences", type=int, default=200, help="prefill length (~18 tokens each)")
    parser.add_argument("--ctx-size", type=int, default=8192)
    parser.add_argument("--startup-timeout-s", type=float, default=600.0)
    return parser.parse_args(argv)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post_json(url: str, body: dict | None = None, timeout: float = 600.0) -> dict:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.load(response)


def wait_healthy(url: str, server: subprocess.Popen, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"llama-server exited with {server.returncode} while loading")
        try:
            post_json(f"{url}/health", timeout=2)
            return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            time.sleep(0.25)  # 503 while loading, refused before listening
    raise RuntimeError(f"llama-server not healthy after {timeout_s:g} s")


def stop(server: subprocess.Popen) -> None:
    server.terminate()
    try:
        server.wait(timeout=30)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait()


def show(title: str, summary: StepGpuSummary | None) -> None:
    print(f"\n== {title}")
    if summary is None:
        print("  no GPU readings")
        return
    for key, value in summary.to_dict().items():
        print(f"  {key:24} {round(value, 2) if isinstance(value, float) else value}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    for path in (args.server, args.model):
        if not path.is_file():
            print(f"gpu_check: {path} does not exist", file=sys.stderr)
            return 1
    wall_start = time.monotonic()
    with GpuSampler() as gpus:
        if gpus.unavailable:
            print(f"gpu_check: {gpus.unavailable}", file=sys.stderr)
            return 2
        print("host:", json.dumps(capture(args.model).to_dict(), indent=1))  # before the load warms the cache
        idle_start = gpus.mark()
        time.sleep(args.idle_s)
        idle_end = gpus.mark()

        port = free_port()
        log = tempfile.NamedTemporaryFile(prefix="gpu_check-llama-server-", suffix=".log", delete=False)
        argv_server = [str(args.server), "-m", str(args.model), "--host", "127.0.0.1", "--port", str(port),
                       "-ngl", "999", "-c", str(args.ctx_size)]
        print("\nstarting:", " ".join(argv_server), f"(log {log.name})")
        server = subprocess.Popen(argv_server, stdout=log, stderr=subprocess.STDOUT)
        gpus.pid = server.pid
        try:
            url = f"http://127.0.0.1:{port}"
            wait_healthy(url, server, args.startup_timeout_s)
            prefill_start = gpus.mark()
            reply = post_json(f"{url}/completion", {"prompt": SENTENCE * args.prompt_sentences,
                                                    "n_predict": 1, "cache_prompt": False})
            prefill_end = gpus.mark()
        except (RuntimeError, OSError) as err:
            print(f"gpu_check: {err}\n{Path(log.name).read_text()[-3000:]}", file=sys.stderr)
            return 1
        finally:
            stop(server)
            log.close()

        show(f"idle, {idle_end - idle_start:.1f} s before the server", gpus.summary(idle_start, idle_end))
        prefill = gpus.summary(prefill_start, prefill_end)
        timings = reply.get("timings", {})
        show(f"prefill of {timings.get('prompt_n')} tokens, server says {timings.get('prompt_ms', 0):.0f} ms",
             prefill)
        traces = gpus.traces()
    wall_s = time.monotonic() - wall_start

    print("\n== sampler")
    for trace in traces:
        lost = f", lost: {trace.lost.reason}" if trace.lost else ""
        print(f"  GPU {trace.index} {trace.name}: {len(trace.samples)} samples{lost}")
    print(f"  CPU {gpus.cpu_seconds:.3f} s over {wall_s:.1f} s wall ({100 * gpus.cpu_seconds / wall_s:.2f}% of a core)")
    if prefill is not None and not prefill.pid_on_gpu:
        print("  WARNING: llama-server's pid was not among the GPU's compute processes"
              " (CPU-only build, or a container with its own pid namespace)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
