"""The default llama-server runs on a CPU without AVX-512, shown on an emulated one.

Most machines the tests run on have AVX-512, so a green run there says nothing about
our users' AVX2-only desktops and AMD hosts. Debian's qemu-user emulates an x86-64 CPU
with AVX2 and without AVX-512 (`-cpu max`): the default build must serve a completion
there, and a binary that uses AVX-512 must die there with SIGILL, which also shows
that the emulation can make this test fail. `make test` installs qemu-user.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from reusebench import check, cli, tiny
from reusebench.config import profiles
from reusebench.llama.client import LlamaClient
from reusebench.llama.process import ServerError, ServerProcess

from conftest import default_llama_server

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(os.uname().machine != "x86_64", reason="emulates an x86-64 CPU; this machine is not one"),
]

QEMU = "qemu-x86_64"
EMULATED_CPU = "max"  # every extension qemu's TCG implements: AVX2, no AVX-512

# Adds two AVX-512 vectors: one instruction a CPU without AVX-512F cannot execute.
AVX512_PROGRAM = """\
#include <immintrin.h>
int main(void) {
    float in[16] = {1.0f};
    __m512 v = _mm512_loadu_ps(in);
    float out[16];
    _mm512_storeu_ps(out, _mm512_add_ps(v, v));
    return out[0] == 2.0f ? 0 : 1;
}
"""


def emulated(binary: Path, wrapper: Path) -> Path:
    """A launcher that runs `binary` on qemu's emulated CPU (exec: the server's process is qemu itself)."""
    qemu = shutil.which(QEMU)
    assert qemu, f"{QEMU} not found: `make test` installs it (apt-get install qemu-user)"
    wrapper.write_text(f'#!/bin/sh\nexec "{qemu}" -cpu {EMULATED_CPU} "{binary}" "$@"\n')
    wrapper.chmod(0o755)
    return wrapper


@pytest.fixture(scope="module")
def avx512_binary(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("avx512")
    (directory / "avx512.c").write_text(AVX512_PROGRAM)
    subprocess.run(["cc", "-O0", "-mavx512f", "-o", "avx512", "avx512.c"], cwd=directory, check=True)
    return directory / "avx512"


def test_emulated_cpu_lacks_avx512(avx512_binary: Path, tmp_path: Path) -> None:
    done = subprocess.run([str(emulated(avx512_binary, tmp_path / "run"))], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == -4, (done.returncode, done.stderr)  # SIGILL
    assert "Illegal instruction" in done.stderr


def test_a_server_killed_by_sigill_gets_one_line_that_says_why(avx512_binary: Path, tmp_path: Path) -> None:
    server = ServerProcess(emulated(avx512_binary, tmp_path / "llama-server"), ["-m", "unused.gguf"])
    with pytest.raises(ServerError) as died:
        server.start()
    message = str(died.value)
    assert "\n" not in message and "died with SIGILL" in message
    assert "uses CPU instructions this machine lacks" in message and "`reusebench build`" in message
    assert "Illegal instruction" in died.value.log_tail  # the start-up log stays available


def test_check_and_run_name_sigill_in_one_line(avx512_binary: Path, tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    binary = emulated(avx512_binary, tmp_path / "llama-server")
    profile = tmp_path / "p.yaml"
    profile.write_text(f"extends: tiny-llama\nbinary: {binary}\n")
    verdicts = check.check_variant(profiles.load_profile(profile, check_binary=False).variants[0])
    assert verdicts and {v.verdict for v in verdicts} == {check.Verdict.UNVERIFIED}
    assert all(len(v.evidence) == 1 and "died with SIGILL" in v.evidence[0] for v in verdicts)
    assert cli.main(["run", "--profile", str(profile), "--size", "1K", "--results", str(tmp_path)]) == 3  # the binary a profile names is wrong
    (error,) = capsys.readouterr().err.strip().splitlines()
    assert "died with SIGILL" in error and "`reusebench build`" in error


def test_default_build_serves_a_completion_on_a_cpu_without_avx512(tmp_path: Path) -> None:
    binary = emulated(default_llama_server(), tmp_path / "llama-server")
    prompt = " ".join(tiny.WORDS[i % len(tiny.WORDS)] for i in range(300))
    args = ["-m", str(tiny.model_path("llama")), "-c", "1024", "-np", "1", "-t", "2"]
    with ServerProcess(binary, args, health_timeout_s=300) as server, \
            LlamaClient(server.base_url, server.api_key, timeout_s=300) as client:
        completion = client.complete(prompt, n_predict=4)
    assert completion.prompt_n == 301 and completion.predicted_n == 4
