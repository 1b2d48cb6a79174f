"""The CUDA side of `reusebench build --flavor cuda`: which toolkit, which CUDA major, which GPU architectures.

- The toolkit: a system one (`nvcc` on PATH, `$CUDA_HOME` or /usr/local/cuda) when it is complete, with
  cuBLAS; otherwise NVIDIA's toolkit wheels from PyPI, pinned by hash and installed into the build cache,
  never into the venv (CPU users must not download a gigabyte).
- The CUDA major: the newest the driver supports (NVML's CUDA driver version) when a GPU is visible, else
  `--cuda 12|13`.
- The architectures: `--cuda-arch 90` (H100/H200), `120` (RTX PRO 6000 Blackwell), a list, or `native`, which
  needs a visible GPU (the default on a GPU box).
- The driver library: ggml-cuda links libcuda for its virtual-memory pool. The wheels carry no libcuda stub,
  so where neither the toolkit nor the system has one (a machine without the driver), the build uses
  `GGML_CUDA_NO_VMM` (ggml's legacy pool) instead.
- At run time the binary finds the toolkit's cudart and cuBLAS through its RUNPATH, so the user sets no
  `LD_LIBRARY_PATH`; where that directory does not exist (the binary was carried to another machine), the
  loader falls back to the system's CUDA libraries.
"""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reusebench.llama.builder import BuildError, cache_root

MAJORS = (12, 13)
TOOLKIT_CHOICES = ("auto", "system", "pypi")
MAJOR_ENV, ARCH_ENV, TOOLKIT_ENV = "REUSEBENCH_CUDA", "REUSEBENCH_CUDA_ARCH", "REUSEBENCH_CUDA_TOOLKIT"


@dataclass(frozen=True)
class Wheel:
    """One toolkit wheel on PyPI: its version and the sha256 of its x86_64 and aarch64 Linux files."""

    name: str
    version: str
    sha256: tuple[str, str]

    @property
    def requirement(self) -> str:
        return f"{self.name}=={self.version} " + " ".join(f"--hash=sha256:{h}" for h in self.sha256)


# What building ggml-cuda needs: nvcc (with, for CUDA 13, its crt headers and nvvm in their own wheels), the
# runtime, cuBLAS, and CCCL (cub, thrust). CUDA 13.0 needs driver 580 or newer; 12.9 runs on 575 or newer.
TOOLKIT_WHEELS: dict[int, tuple[Wheel, ...]] = {
    13: (
        Wheel("nvidia-cuda-nvcc", "13.0.88", ("56fe502eb77625a12f25172caa3cdddb4e4c8ba2c8c17dba44b164761b380f03",
                                              "c7ff28f86a24effdc6c034fa15230c549a273e4771b10a7fec14996f8cf3307f")),
        Wheel("nvidia-cuda-crt", "13.0.88", ("2c8043c7c9e02492716426e9919fc78d2c5b3b2a7a768a88e952676b08aa55a4",
                                             "ee2ea2a97073e02ee62bb27841f437332be2c248e3eac013df07997ada39c003")),
        Wheel("nvidia-nvvm", "13.0.88", ("c5f41ffeb6466944a026dfa5317d7d85355c119bbec279205d22f1869d1054e0",
                                         "c4376a291d72d22a315d9d2f69bdae8f8cd83a627f75bad395cee49a0fe65dc1")),
        Wheel("nvidia-cuda-runtime", "13.0.96", ("7f82250d7782aa23b6cfe765ecc7db554bd3c2870c43f3d1821f1d18aebf0548",
                                                 "ef9bcbe90493a2b9d810e43d249adb3d02e98dd30200d86607d8d02687c43f55")),
        Wheel("nvidia-cuda-cccl", "13.0.85", ("e0da7ad981f3a8aff08241b5bfc1af868742a63e2762f53a5171c492ef242649",
                                              "6f0203e29fed809ee2b7fe9b1344df66ecab990c37d6a2e0e189b26d6c97ed7c")),
        Wheel("nvidia-cublas", "13.0.2.14", ("0cf238ffdbe46c00cb9aa98e7bca745c223a5ca5a53e686ac8b3e5a08fe80d6c",
                                             "17165c296de689662b96e0ef4f21dfbff3092ff00d0e3e59470f5acb08c0f87d")),
    ),
    12: (
        Wheel("nvidia-cuda-nvcc-cu12", "12.9.86", ("5d6a0d32fdc7ea39917c20065614ae93add6f577d840233237ff08e9a38f58f0",
                                                   "44e1eca4d08926193a558d2434b1bf83d57b4d5743e0c431c0c83d51da1df62b")),
        Wheel("nvidia-cuda-runtime-cu12", "12.9.79", (
            "25bba2dfb01d48a9b59ca474a1ac43c6ebf7011f1b0b8cc44f54eb6ac48a96c3",
            "83469a846206f2a733db0c42e223589ab62fd2fabac4432d2f8802de4bded0a4")),
        Wheel("nvidia-cuda-cccl-cu12", "12.9.27", ("37869e17ce2e1ecec6eddf1927cca0f8c34e64fd848d40453df559091e2d7117",
                                                   "d7898b38aa68beaa234d48f0868273702342a196d6e2e9d0ef058dca2390ebea")),
        Wheel("nvidia-cublas-cu12", "12.9.1.4", ("453611eb21a7c1f2c2156ed9f3a45b691deda0440ec550860290dc901af5b4c2",
                                                 "7a950dae01add3b415a5a5cdc4ec818fb5858263e9cca59004bb99fdbbd3a5d6")),
    ),
}
# The oldest architecture each major compiles for (CUDA 13 dropped Maxwell, Pascal and Volta).
MIN_ARCH = {12: 50, 13: 75}
_ARCH = re.compile(r"^(\d{2,3})[af]?(-real|-virtual)?$")
_RELEASE = re.compile(r"release (\d+)\.(\d+), V([\d.]+)")
NVCC_TIMEOUT_S = 60
LDCONFIG_ARCH = {"x86_64": "x86-64", "aarch64": "AArch64"}  # how `ldconfig -p` names each
TOOLKIT_INFO = "toolkit.json"


@dataclass(frozen=True)
class Toolkit:
    """A CUDA toolkit root with bin/nvcc, include and lib: where it came from and its nvcc version."""

    root: Path
    version: str  # "13.0.88"
    origin: str  # "system" or "PyPI"

    @property
    def major(self) -> int:
        return int(self.version.split(".")[0])

    @property
    def nvcc(self) -> Path:
        return self.root / "bin" / "nvcc"

    @property
    def lib_dir(self) -> Path:
        return next((self.root / d for d in ("lib64", "lib") if (self.root / d).is_dir()), self.root / "lib")


@dataclass(frozen=True)
class CudaBuild:
    """What `--flavor cuda` adds to the CMake line, and what build.json says about it."""

    cmake_args: tuple[str, ...]
    details: dict[str, Any]


def driver_state(nvml: Any = None) -> tuple[int | None, int]:
    """The newest CUDA major this machine's driver supports, and how many GPUs it sees, read through NVML;
    (None, 0) without a GPU driver."""
    if nvml is None:
        import pynvml

        nvml = pynvml
    try:
        nvml.nvmlInit()
    except Exception:  # no driver, no GPU, no NVML library: all mean "not readable here"
        return None, 0
    try:
        return int(nvml.nvmlSystemGetCudaDriverVersion_v2()) // 1000, int(nvml.nvmlDeviceGetCount())
    except Exception:
        return None, 0
    finally:
        nvml.nvmlShutdown()


def choose_major(requested: int | None, driver: int | None) -> int:
    """The CUDA major to build with: `--cuda` if given and the driver allows it, else the driver's newest."""
    if requested is not None and requested not in MAJORS:
        raise BuildError(f"--cuda {requested}: reusebench builds with CUDA {' or '.join(map(str, MAJORS))}")
    if driver is None:
        if requested is None:
            raise BuildError("no NVIDIA driver is readable here (NVML): pass --cuda 12 or --cuda 13, the CUDA major "
                             "the GPU box's driver supports (nvidia-smi shows it)")
        return requested
    if driver < min(MAJORS):
        raise BuildError(f"this machine's driver supports CUDA {driver} at most; CUDA 12 needs driver 525 or newer")
    if requested is not None and requested > driver:
        raise BuildError(f"--cuda {requested}: this machine's driver supports CUDA {driver} at most")
    return requested if requested is not None else min(driver, max(MAJORS))


def parse_archs(value: str | None, gpu_visible: bool, major: int) -> str:
    """`CMAKE_CUDA_ARCHITECTURES` from `--cuda-arch`: "90", "90,120" (or "90;120"), or "native"."""
    if value is None or value == "native":
        if gpu_visible:
            return "native"
        raise BuildError("no GPU is visible here, so --cuda-arch cannot be native: pass the GPU box's architecture, "
                         "e.g. --cuda-arch 90 (H100/H200) or --cuda-arch 120 (RTX PRO 6000 Blackwell)")
    archs = [a.strip() for a in re.split(r"[,;]", value) if a.strip()]
    if not archs:
        raise BuildError(f"--cuda-arch {value!r}: no architecture given")
    for arch in archs:
        match = _ARCH.match(arch)
        if not match:
            raise BuildError(f"--cuda-arch {arch!r}: expected a compute capability such as 90, 120 or 90-real")
        if int(match.group(1)) < MIN_ARCH[major]:
            raise BuildError(f"--cuda-arch {arch}: CUDA {major} compiles for {MIN_ARCH[major]} and newer")
    return ";".join(archs)


# --- toolkits --------------------------------------------------------------------------------------


def nvcc_version(nvcc: Path) -> str | None:
    try:
        done = subprocess.run([str(nvcc), "--version"], capture_output=True, text=True, timeout=NVCC_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        return None
    match = _RELEASE.search(done.stdout)
    return match.group(3) if match else None


def _nvcc_root(nvcc: Path) -> Path:
    # nvcc on PATH is often a wrapper script or a symlink; nvcc itself says where its toolkit is.
    try:
        done = subprocess.run([str(nvcc), "--dryrun", "-x", "cu", "/dev/null"], capture_output=True, text=True,
                              timeout=NVCC_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        return nvcc.resolve().parent.parent
    for line in (done.stdout + done.stderr).splitlines():
        if line.startswith("#$ TOP="):
            return Path(line.split("=", 1)[1]).resolve()
    return nvcc.resolve().parent.parent


def system_toolkit() -> tuple[Toolkit | None, str]:
    """The system's CUDA toolkit if it is complete enough for ggml-cuda, else None and why not."""
    candidates = []
    if os.environ.get("CUDA_HOME"):
        candidates.append(Path(os.environ["CUDA_HOME"]) / "bin" / "nvcc")
    on_path = shutil.which("nvcc")
    if on_path:
        candidates.append(Path(on_path))
    candidates.append(Path("/usr/local/cuda/bin/nvcc"))
    nvcc = next((c for c in candidates if c.is_file() and os.access(c, os.X_OK)), None)
    if nvcc is None:
        return None, "no nvcc on PATH, in $CUDA_HOME or in /usr/local/cuda"
    root = _nvcc_root(nvcc)
    version = nvcc_version(root / "bin" / "nvcc")
    if version is None:
        return None, f"{nvcc} does not report its version"
    toolkit = Toolkit(root=root, version=version, origin="system")
    if not (root / "include" / "cublas_v2.h").is_file() or not any(toolkit.lib_dir.glob("libcublas.so*")):
        return None, f"the system toolkit at {root} (CUDA {version}) has no cuBLAS"
    return toolkit, f"the system toolkit at {root} (CUDA {version})"


def pypi_toolkit(major: int, progress: Callable[[str], None]) -> Toolkit:
    """NVIDIA's CUDA `major` toolkit wheels, hash-checked, as one toolkit root in the build cache (installed once)."""
    wheels = TOOLKIT_WHEELS[major]
    home = cache_root() / "cuda" / f"cu{major}-{wheels[0].version}-{platform.machine()}"
    info_path = home / TOOLKIT_INFO
    pins = [f"{w.name}=={w.version}" for w in wheels]
    if info_path.is_file():
        info = json.loads(info_path.read_text())
        if info.get("wheels") == pins:  # the same pins: installed already (a changed pin installs anew, here)
            return Toolkit(root=home / "root", version=info["nvcc"], origin="PyPI")
    home.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=home.parent) as scratch:
        requirements = Path(scratch) / "requirements.txt"
        requirements.write_text("".join(f"{w.requirement}\n" for w in wheels))
        progress(f"installing the CUDA {major} toolkit from PyPI into {home} (about 1 GB, once): "
                 + ", ".join(f"{w.name}=={w.version}" for w in wheels))
        target = Path(scratch) / "site"
        done = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--only-binary", ":all:",
                               "--require-hashes", "-r", str(requirements), "--target", str(target)],
                              capture_output=True, text=True)
        if done.returncode != 0:
            raise BuildError(f"pip install of the CUDA {major} toolkit wheels failed: {done.stderr.strip()[-800:]}")
        root = Path(scratch) / "root"
        _merge_toolkit(target / "nvidia", root)
        version = nvcc_version(root / "bin" / "nvcc")
        if version is None or int(version.split(".")[0]) != major:
            raise BuildError(f"the CUDA {major} wheels' nvcc reports version {version}")
        shutil.rmtree(home, ignore_errors=True)
        home.mkdir()
        root.rename(home / "root")
        info_path.write_text(json.dumps({"nvcc": version, "wheels": pins}, indent=2) + "\n")
    return Toolkit(root=home / "root", version=version, origin="PyPI")


def _merge_toolkit(packages: Path, root: Path) -> None:
    """One toolkit root from the wheels' `nvidia/<package>/` trees, laid out as a CUDA install is.

    CUDA 13's wheels share one `nvidia/cu13/`; CUDA 12's have one directory per package. Wheels carry no
    symlinks, so the unversioned library names the linker and CMake look for are made here, and `lib64`
    (where nvcc's profile looks) points at `lib`.
    """
    root.mkdir()
    for package in sorted(p for p in packages.iterdir() if p.is_dir()):
        _move_merged(package, root)
    lib = root / "lib"
    for versioned in lib.glob("lib*.so.*"):
        plain = lib / (versioned.name.split(".so.")[0] + ".so")
        if not plain.exists():
            plain.symlink_to(versioned.name)
    if not (root / "lib64").exists():
        (root / "lib64").symlink_to("lib")


def _move_merged(source: Path, target: Path) -> None:
    for entry in source.iterdir():
        if entry.name == "__pycache__" or entry.name.endswith(".py"):  # the wheels' Python package markers
            continue
        if entry.is_dir() and (target / entry.name).is_dir():
            _move_merged(entry, target / entry.name)
        elif not (target / entry.name).exists():
            entry.rename(target / entry.name)


def driver_library(toolkit: Toolkit) -> Path | None:
    """A libcuda to link against: the toolkit's stub, else the installed driver's; None on a machine without."""
    for stubs in (toolkit.root / "lib64" / "stubs", toolkit.root / "lib" / "stubs"):
        if (stubs / "libcuda.so").is_file():
            return stubs / "libcuda.so"
    ldconfig = shutil.which("ldconfig") or "/sbin/ldconfig"
    try:
        listed = subprocess.run([ldconfig, "-p"], capture_output=True, text=True).stdout
    except OSError:
        return None
    # this machine's own architecture only: a multiarch host also lists the 32-bit library
    found = re.findall(rf"libcuda\.so(?:\.1)? \(libc6,{LDCONFIG_ARCH.get(platform.machine(), '')}.*\) => (\S+)",
                       listed)
    return Path(found[0]) if found else None


def select_toolkit(choice: str, major: int, progress: Callable[[str], None]) -> Toolkit:
    """`--cuda-toolkit auto` takes a complete system toolkit of the right major, else PyPI's."""
    if choice not in TOOLKIT_CHOICES:
        raise BuildError(f"--cuda-toolkit {choice!r}: choose from {', '.join(TOOLKIT_CHOICES)}")
    if choice != "pypi":
        toolkit, why = system_toolkit()
        if toolkit is not None and toolkit.major == major:
            progress(f"CUDA: {why}")
            return toolkit
        if toolkit is not None:
            why = f"{why} is not CUDA {major}"
        if choice == "system":
            raise BuildError(f"--cuda-toolkit system: {why}")
        progress(f"CUDA: {why}; using NVIDIA's CUDA {major} wheels from PyPI")
    return pypi_toolkit(major, progress)


def cuda_build(*, major: int | None, arch: str | None, toolkit: str = "auto",
               progress: Callable[[str], None] = print, nvml: Any = None) -> CudaBuild:
    """Everything `--flavor cuda` decides: the toolkit (installed if needed), the architectures, the driver library."""
    driver, gpus = driver_state(nvml)
    chosen = choose_major(major, driver)
    archs = parse_archs(arch, gpu_visible=gpus > 0, major=chosen)
    kit = select_toolkit(toolkit, chosen, progress)
    libcuda = driver_library(kit)
    args = [
        f"-DCMAKE_CUDA_ARCHITECTURES={archs}",
        f"-DCUDAToolkit_ROOT={kit.root}",
        f"-DCMAKE_CUDA_COMPILER={kit.nvcc}",
        f"-DCMAKE_BUILD_RPATH={kit.lib_dir}",
        f"-DCUDA_cuda_driver_LIBRARY={libcuda}" if libcuda else "-DGGML_CUDA_NO_VMM=ON",
    ]
    if libcuda is None:
        progress("CUDA: no libcuda here (no driver, and the toolkit has no stub): building with GGML_CUDA_NO_VMM")
    details = {"toolkit": kit.origin, "toolkit_root": str(kit.root), "cuda": kit.version, "architectures": archs,
               "driver_cuda_major": driver, "vmm": libcuda is not None}
    return CudaBuild(cmake_args=tuple(args), details=details)


def cuda_build_from_env(progress: Callable[[str], None] = print) -> CudaBuild:
    """`cuda_build` for asv's install hook: `$REUSEBENCH_CUDA`, `$REUSEBENCH_CUDA_ARCH`, `$REUSEBENCH_CUDA_TOOLKIT`."""
    major = os.environ.get(MAJOR_ENV) or None  # set but empty: unset
    if major is not None and not major.isdigit():
        raise BuildError(f"${MAJOR_ENV}={major!r}: expected 12 or 13")
    return cuda_build(major=int(major) if major else None, arch=os.environ.get(ARCH_ENV) or None,
                      toolkit=os.environ.get(TOOLKIT_ENV) or "auto", progress=progress)
