"""One-command check of the GPU sampler on a machine with an NVIDIA GPU.

    python tools/gpu_check.py --server path/to/llama-server --model path/to/model.gguf

Samples a few idle seconds, then starts llama-server (built with CUDA) on the model and sends one
short prefill, and prints what the sampler saw in each phase. Exits 2 without a GPU, 1 if the
server fails.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout, installed or not

from reusebench.llama.client import ClientError  # noqa: E402
from reusebench.llama.process import ServerError, ServerProcess  # noqa: E402
from reusebench.llama.server import Server  # noqa: E402
from reusebench.machine.gpu import GpuSampler, StepGpuSummary  # noqa: E402
from reusebench.machine.host import capture  # noqa: E402

PREFILL_TIMEOUT_S = 600.0
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

        server = ServerProcess(args.server, ["-m", str(args.model), "-ngl", "999", "-c", str(args.ctx_size)],
                             health_timeout_s=args.startup_timeout_s)
        handle = Server(server, call_timeout_s=PREFILL_TIMEOUT_S)
        print("\nstarting:", " ".join(map(str, [args.server, *server.args])))
        try:
            handle.start()
            gpus.pid = server.pid
            prefill_start = gpus.mark()
            reply = handle.client.complete(SENTENCE * args.prompt_sentences, n_predict=1, cache_prompt=False)
            prefill_end = gpus.mark()
        except (ServerError, ClientError) as err:
            print(f"gpu_check: {err}\n{server.log_tail()}", file=sys.stderr)
            return 1
        finally:
            handle.close()

        show(f"idle, {idle_end - idle_start:.1f} s before the server", gpus.summary(idle_start, idle_end))
        prefill = gpus.summary(prefill_start, prefill_end)
        show(f"prefill of {reply.prompt_n} tokens, server says {reply.prompt_ms:.0f} ms", prefill)
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
