"""Profiles and binaries: shipped profiles validate against the real llama-server's --help,
extends/matrix expand as documented, and every error names its file and field."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from reusebench.config import profile_files, profiles
from reusebench.config.profiles import ProfileError, load_profile
from reusebench.llama import binaries, builder
from reusebench.llama.binaries import BinaryError

GPU_MODEL_ENV = ("REUSEBENCH_GLM_MODEL", "REUSEBENCH_QWEN35_MODEL", "REUSEBENCH_QWEN35_MMPROJ")


def placeholder_gguf(path: Path) -> None:
    """A valid GGUF file without tensors: profiles check a model's header before any launch."""
    import gguf

    writer = gguf.GGUFWriter(path, "llama")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.fixture(autouse=True)
def run_from_repo_root(monkeypatch: pytest.MonkeyPatch) -> None:
    """Messages show paths relative to the working directory; from the repo root, temp files show absolute."""
    monkeypatch.chdir(Path(__file__).resolve().parents[1])


@pytest.fixture(scope="module")
def real_binary() -> binaries.Binary:
    return binaries.resolve_binary("default", source="test")


@pytest.fixture
def gpu_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, real_binary: binaries.Binary) -> None:
    """Point the GPU profiles' model variables at placeholder files, and their binary at the CPU build
    (its --help stands in for the CUDA build's: same source, same options)."""
    monkeypatch.setenv("REUSEBENCH_LLAMA_SERVER", str(real_binary.path))
    for name in GPU_MODEL_ENV:
        placeholder = tmp_path / f"{name.lower()}.gguf"
        placeholder_gguf(placeholder)
        monkeypatch.setenv(name, str(placeholder))


@pytest.fixture
def profile_dir(tmp_path: Path) -> Path:
    placeholder_gguf(tmp_path / "model.gguf")
    return tmp_path


def write(directory: Path, name: str, text: str) -> Path:
    path = directory / f"{name}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def load_error(path: Path, **kwargs: object) -> str:
    with pytest.raises(ProfileError) as caught:
        load_profile(path, **kwargs)
    return str(caught.value)


# --- shipped profiles ------------------------------------------------------------------------


@pytest.mark.usefixtures("gpu_env")
@pytest.mark.parametrize("name", profiles.profile_names())
def test_shipped_profile_validates_against_real_help(name: str, real_binary: binaries.Binary) -> None:
    profile = load_profile(name)
    known = binaries.help_options(real_binary)
    assert profile.variants
    for variant in profile.variants:
        args = variant.server_args()
        assert args[:2] == ["-m", str(variant.model)] and variant.model.is_file()
        passed = {arg[2:] for arg in args if arg.startswith("--")}
        assert passed <= known, passed - known
        assert not passed & set(profile_files.HARNESS_OWNED_OPTIONS)
        assert "ctx-size" not in passed  # the harness sizes the context
        # report A's sizes; the real model on a CPU at what a 2-core machine runs in minutes (it was trained on 32K)
        assert variant.sizes == ((4096, 8192) if name == "gemma3-270m" else (32768, 131072))


def test_shipped_profile_list() -> None:
    assert set(profiles.profile_names()) >= {
        "tiny-base",
        "tiny-qwen35",
        "tiny-granitehybrid",
        "tiny-nemotron_h",
        "tiny-llama",
        "tiny-granitehybrid-longmem",
        "tiny-lora",
        "tiny-sleep",
        "glm-hybrid-gpu",
        "qwen35-mmproj-gpu",
    }


def test_report_a_matrix_expands_to_four_launches() -> None:
    profile = load_profile("tiny-qwen35")
    assert [variant.name for variant in profile.variants] == [
        "mmproj=on,cache-reuse=0",
        "mmproj=on,cache-reuse=256",
        "mmproj=off,cache-reuse=0",
        "mmproj=off,cache-reuse=256",
    ]
    with_mmproj = profile.variant("mmproj=on,cache-reuse=256")
    without = profile.variant("mmproj=off,cache-reuse=256")
    assert with_mmproj.mmproj is not None and "--mmproj" in with_mmproj.server_args()
    assert without.mmproj is None and "--mmproj" not in without.server_args()
    assert without.option("cache-reuse") == 256
    assert without.option("parallel") == 1  # inherited from tiny-base
    assert without.model_spec == "tiny:qwen35"


def test_sleep_profile_uses_values_the_binary_accepts() -> None:
    variants = load_profile("tiny-sleep").variants
    assert [variant.option("sleep-idle-seconds") for variant in variants] == [-1, 3]


def test_lora_profile_passes_the_adapter() -> None:
    variant = load_profile("tiny-lora").variant("default")
    args = variant.server_args()
    assert args[args.index("--lora") + 1] == str(variant.lora[0])
    assert variant.option("cache-ram") == 256
    assert variant.scenarios == ("first_load", "lora_swap")


def test_gpu_profile_names_the_unset_model_variable(monkeypatch: pytest.MonkeyPatch,
                                                   real_binary: binaries.Binary) -> None:
    monkeypatch.setenv("REUSEBENCH_LLAMA_SERVER", str(real_binary.path))
    monkeypatch.delenv("REUSEBENCH_GLM_MODEL", raising=False)
    with pytest.raises(ProfileError, match=r"glm-hybrid-gpu\.yaml:6:1: model: environment variable REUSEBENCH_GLM_MODEL is not set"):
        load_profile("glm-hybrid-gpu")


@pytest.mark.usefixtures("gpu_env")
def test_gpu_profile_binary_comes_from_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REUSEBENCH_LLAMA_SERVER", str(tmp_path / "no-such-llama-server"))
    with pytest.raises(ProfileError, match=r"glm-hybrid-gpu\.yaml:\d+:1: binary: .*no-such-llama-server does not exist"):
        load_profile("glm-hybrid-gpu")
    # Unset, it is the CUDA build of the pinned release.
    monkeypatch.delenv("REUSEBENCH_LLAMA_SERVER")
    monkeypatch.setenv(builder.CACHE_ENV, str(tmp_path))
    with pytest.raises(ProfileError, match=r"glm-hybrid-gpu\.yaml:\d+:1: binary: .* run `reusebench build --flavor cuda`"):
        load_profile("glm-hybrid-gpu")


def test_profiles_are_found_from_any_working_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("REUSEBENCH_PROFILES", raising=False)
    monkeypatch.chdir(tmp_path)
    assert load_profile("tiny-llama").path == Path(profiles.__file__).resolve().parents[2] / "server_profiles" / "tiny-llama.yaml"


def test_profiles_dir_can_be_overridden(profile_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write(profile_dir, "only-here", "model: model.gguf\nsizes: [1K]\n")
    monkeypatch.setenv("REUSEBENCH_PROFILES", str(profile_dir))
    assert profiles.profile_names() == ["only-here"]
    assert load_profile("only-here").variants[0].sizes == (1024,)


# --- extends and matrix ------------------------------------------------------------------------


def test_extends_deep_merges_and_matrix_expands(profile_dir: Path) -> None:
    placeholder_gguf(profile_dir / "proj.gguf")
    write(
        profile_dir,
        "base",
        """
description: base
model: model.gguf
options:
  cache-ram: 256
  threads: 2
  metrics: true
sizes: [32K]
n_predict: 4
""",
    )
    child = write(
        profile_dir,
        "child",
        """
extends: base
mmproj: proj.gguf
options:
  threads: 4        # child wins
  metrics: null     # unsets the inherited flag
  kv-unified: true
matrix:
  mmproj: [false, true]
  cache-reuse: [0, 256]
""",
    )
    profile = load_profile(child)
    assert profile.name == "child" and profile.description == "base"
    assert [variant.name for variant in profile.variants] == [
        "mmproj=off,cache-reuse=0",
        "mmproj=off,cache-reuse=256",
        "mmproj=on,cache-reuse=0",
        "mmproj=on,cache-reuse=256",
    ]
    model = str(profile_dir / "model.gguf")
    assert profile.variant("mmproj=off,cache-reuse=256").server_args() == [
        "-m", model,
        "--cache-ram", "256", "--cache-reuse", "256", "--kv-unified", "--threads", "4",
    ]  # fmt: skip
    assert profile.variant("mmproj=on,cache-reuse=0").server_args()[:4] == ["-m", model, "--mmproj", str(profile_dir / "proj.gguf")]
    variant = profile.variants[0]
    assert (variant.sizes, variant.n_predict, variant.verify) == ((32768,), 4, True)
    assert variant.scenarios == profiles.SCENARIO_IDS
    assert variant.option("metrics") is None and variant.option("kv-unified") is True


def test_extends_by_relative_path_and_false_flag_is_omitted(profile_dir: Path) -> None:
    write(profile_dir / "bases", "common", "model: ../model.gguf\nsizes: [100]\noptions: {kv-unified: true}\n")
    child = write(profile_dir, "child", "extends: bases/common.yaml\noptions: {kv-unified: false}\n")
    variant = load_profile(child).variant("default")
    assert variant.model == profile_dir / "bases" / "../model.gguf"
    assert "--kv-unified" not in variant.server_args()


def test_extends_a_shipped_profile_from_a_directory_of_ones_own(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A name in `extends:` is a profile as `--profile NAME` takes it: the shipped one, unless a file of that
    name sits beside the extending profile."""
    monkeypatch.delenv("REUSEBENCH_PROFILES", raising=False)
    mine = write(tmp_path / "my-profiles", "mine", "extends: tiny-base\nmodel: tiny:llama\n")
    assert profiles.profile_files(mine) == [profiles.default_profiles_dir() / "tiny-base.yaml", mine]
    variant = load_profile(mine, check_binary=False).variant("default")
    assert variant.option("ctx-checkpoints") == 32 and variant.sizes == (32768, 131072)  # tiny-base's
    own_base = write(tmp_path / "my-profiles", "tiny-base", "sizes: [1K]\n")
    assert profiles.profile_files(mine) == [own_base, mine]
    assert load_profile(mine, check_binary=False).variant("default").sizes == (1024,)


def test_a_profile_without_sizes_loads_and_the_run_asks_for_them(profile_dir: Path) -> None:
    from reusebench.run import runner

    profile = load_profile(write(profile_dir, "nosizes", "model: model.gguf\n"), check_binary=False)
    assert profile.variant("default").sizes == ()
    with pytest.raises(ValueError, match=r"nosizes\.yaml: sizes: the profile .* names none: give the sizes to run, "
                                         r"e\.g\. --size 32K"):
        runner.run_profile(profile, results_dir=profile_dir / "results")
    assert not (profile_dir / "results").exists()  # refused before anything started


def test_outline_reads_description_and_variants_without_resolving_files(profile_dir: Path) -> None:
    path = write(profile_dir, "m", "description: two\nmodel: not-there.gguf\nmmproj: nor-this.gguf\n"
                                   "options: {threads: 2, kv-unified: false}\nmatrix:\n  mmproj: [false, true]\n")
    assert profiles.outline(path) == profiles.Outline("m", "two", ("mmproj=off", "mmproj=on"), {
        "mmproj=off": ("threads",), "mmproj=on": ("threads", "mmproj")})  # kv-unified: false is left out


def test_yaml_on_off_stay_strings(profile_dir: Path) -> None:
    path = write(profile_dir, "fa", "model: model.gguf\nsizes: [100]\noptions:\n  flash-attn: on\n")
    assert load_profile(path).variant("default").server_args()[-2:] == ["--flash-attn", "on"]


def test_option_value_expands_env(profile_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLOT_DIR", str(profile_dir))
    path = write(profile_dir, "slots", "model: model.gguf\nsizes: [100]\noptions:\n  slot-save-path: ${SLOT_DIR}/slots\n")
    assert load_profile(path).variant("default").option("slot-save-path") == f"{profile_dir}/slots"


def test_a_template_file_is_found_beside_the_profile_that_names_it(profile_dir: Path, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    (profile_dir / "templates").mkdir()
    (profile_dir / "templates" / "chat.jinja").write_text("{{ messages[0]['content'] }}")
    base = write(profile_dir, "base", "options:\n  chat-template-file: templates/chat.jinja\n")
    mine = write(tmp_path / "elsewhere", "mine", f"extends: {base}\nmodel: {profile_dir}/model.gguf\nsizes: [100]\n")
    monkeypatch.chdir(tmp_path / "elsewhere")  # not from the working directory: from the file that set it
    assert load_profile(mine).variant("default").option("chat-template-file") == str(profile_dir / "templates" / "chat.jinja")


def test_unknown_variant_lists_valid_names(profile_dir: Path) -> None:
    path = write(profile_dir, "m", "model: model.gguf\nsizes: [100]\nmatrix:\n  cache-reuse: [0, 256]\n")
    with pytest.raises(ProfileError, match=r"no variant 'cache-reuse=1'; valid variants: cache-reuse=0, cache-reuse=256"):
        load_profile(path).variant("cache-reuse=1")


def test_check_binary_false_skips_the_help_check(profile_dir: Path) -> None:
    # b11434 no longer has --mlock (it became --load-mode); an older build would take it
    path = write(profile_dir, "older", "model: model.gguf\nsizes: [100]\noptions:\n  mlock: true\n")
    assert load_profile(path, check_binary=False).variant("default").option("mlock") is True
    assert "mlock" in load_error(path)


# --- errors name file and field ----------------------------------------------------------------

VALID = "model: model.gguf\nsizes: [100]\n"

ERROR_CASES = {
    "typo option": (
        VALID + "options:\n  cache-reus: 256\n",
        r"options\.cache-reus: unknown llama-server option \(did you mean 'cache-reuse'\?\); flags get renamed and removed",
    ),
    "typo in matrix axis": (VALID + "matrix:\n  ubatch: [64]\n", r"matrix\.ubatch: unknown llama-server option \(did you mean 'ubatch-size'\?\)"),
    "removed option": (VALID + "options:\n  draft-max: 4\n", r"options\.draft-max: removed from this llama-server: the argument has been removed"),
    "flag given a value": (VALID + "options:\n  kv-unified: 1\n", r"options\.kv-unified: --kv-unified is a bare flag"),
    "value option given true": (VALID + "options:\n  cache-reuse: true\n", r"options\.cache-reuse: --cache-reuse takes a value"),
    "option with dashes": (VALID + "options:\n  --cache-ram: 1\n", r"options\.--cache-ram: write the option's long name without dashes"),
    "wrong type": (VALID + "n_predict: '8'\n", r"n_predict: expected an integer, got str \('8'\)"),
    "bool is not an integer": (VALID + "n_predict: true\n", r"n_predict: expected an integer, got a boolean"),
    "yes is not a boolean": (VALID + "verify: yes\n", r"verify: expected true or false, got str \('yes'\)"),
    "option value is a list": (VALID + "options:\n  threads: [1, 2]\n", r"options\.threads: expected a string, number or true/false, got a list"),
    "unknown key": ("modle: model.gguf\nsizes: [100]\n", r"modle: unknown field \(did you mean 'model'\?\)"),
    "missing model file": ("model: nope.gguf\nsizes: [100]\n", r"model: .*nope\.gguf does not exist"),
    "missing lora file": (VALID + "lora: [model.gguf, nope.gguf]\n", r"lora\[1\]: .*nope\.gguf does not exist"),
    "missing template file": (VALID + "options:\n  chat-template-file: t/nope.jinja\n",
                              r"options\.chat-template-file: .*t/nope\.jinja does not exist"),
    "unknown tiny model": ("model: tiny:mamba9\nsizes: [100]\n", r"model: unknown tiny model 'mamba9'; valid names: qwen35"),
    "unset env var": ("model: ${REUSEBENCH_TEST_UNSET}/m.gguf\nsizes: [100]\n", r"model: environment variable REUSEBENCH_TEST_UNSET is not set"),
    "harness-owned port": (VALID + "options:\n  port: 8080\n", r"options\.port: set by the harness, not by profiles \(the harness picks a free port\)"),
    "harness-owned verbosity": (VALID + "matrix:\n  log-verbosity: [4]\n", r"matrix\.log-verbosity: set by the harness"),
    "model as an option": (VALID + "options:\n  mmproj: x.gguf\n", r"options\.mmproj: use the top-level field `mmproj:` instead"),
    "empty matrix axis": (VALID + "matrix:\n  cache-reuse: []\n", r"matrix\.cache-reuse: expected a non-empty list of values"),
    "duplicate matrix value": (VALID + "matrix:\n  cache-reuse: [256, '256']\n", r"matrix\.cache-reuse: lists a value twice"),
    "mmproj axis without mmproj": (VALID + "matrix:\n  mmproj: [true, false]\n", r"matrix\.mmproj: the profile sets no `mmproj:` to toggle"),
    "mmproj axis with a number": (VALID + "mmproj: model.gguf\nmatrix:\n  mmproj: [1]\n", r"matrix\.mmproj\[0\]: expected true or false"),
    "bad size": ("model: model.gguf\nsizes: [32K, 32Q]\n", r"sizes\[1\]: expected a positive token count such as 2048, 32K or 1M, got '32Q'"),
    "negative size": ("model: model.gguf\nsizes: [-5]\n", r"sizes\[0\]: expected a positive token count .*, got -5$"),
    "zero size": ("model: model.gguf\nsizes: [1K, 0]\n", r"sizes\[1\]: expected a positive token count .*, got 0$"),
    "size not a number": ("model: model.gguf\nsizes: [abc]\n", r"sizes\[0\]: expected a positive token count .*, got 'abc'$"),
    "unknown scenario": (VALID + "scenarios: [first_load, resned]\n", r"scenarios\[1\]: unknown scenario 'resned' \(did you mean 'resend'\?\)"),
    "missing extends target": (VALID + "extends: nowhere\n",
                               r"extends: no profile 'nowhere': neither .*nowhere\.yaml nor .*nowhere\.yaml exists"),
    "missing extends path": (VALID + "extends: bases/nowhere.yaml\n", r"extends: .*bases/nowhere\.yaml does not exist"),
    "top level not a mapping": ("- model.gguf\n", r"expected a mapping of profile fields, got a list"),
}


@pytest.mark.parametrize("text, expected", ERROR_CASES.values(), ids=ERROR_CASES.keys())
def test_error_names_file_and_field(profile_dir: Path, text: str, expected: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("REUSEBENCH_TEST_UNSET", raising=False)
    path = write(profile_dir, "bad", text)
    message = load_error(path)
    assert re.match(rf"{re.escape(str(path))}:\d+:\d+: ", message), message
    assert re.search(expected, message), message


def test_an_error_names_the_line_and_column_of_its_field(profile_dir: Path) -> None:
    path = write(profile_dir, "bad", VALID + "options:\n  threads: 2\n  cache-reus: 256\n")
    assert load_error(path).startswith(f"{path}:5:3: options.cache-reus: unknown llama-server option")  # line 5, indent 2


@pytest.mark.parametrize(
    "text, line",
    [
        ("model: model.gguf\nsizes: [100\noptions: {}\n", 3),  # unclosed flow sequence
        ("model: model.gguf\nsizes: [100]\nmodel: other.gguf\n", 3),  # duplicate key
    ],
)
def test_malformed_yaml_names_the_line(profile_dir: Path, text: str, line: int) -> None:
    path = write(profile_dir, "broken", text)
    assert re.match(rf"{re.escape(str(path))}:{line}:\d+: invalid YAML: ", load_error(path))


def test_extends_cycle(profile_dir: Path) -> None:
    a = write(profile_dir, "a", VALID + "extends: b\n")
    b = write(profile_dir, "b", "extends: a\n")
    assert load_error(a) == f"{b}:1:1: extends: cycle {a} -> {b} -> {a}"
    self_loop = write(profile_dir, "self", VALID + "extends: self.yaml\n")
    assert load_error(self_loop) == f"{self_loop}:3:1: extends: cycle {self_loop} -> {self_loop}"


def test_error_in_base_names_the_base_file(profile_dir: Path) -> None:
    base = write(profile_dir, "base", VALID + "options:\n  cache-reus: 1\n")
    child = write(profile_dir, "child", "extends: base\n")
    assert load_error(child).startswith(f"{base}:4:3: options.cache-reus: unknown llama-server option")


def test_unknown_profile_name_lists_available(profile_dir: Path) -> None:
    write(profile_dir, "one", VALID)
    with pytest.raises(ProfileError, match=r"no such profile \(profiles in .*: one\)"):
        load_profile("two", profiles_dir=profile_dir)


# --- binaries ----------------------------------------------------------------------------------

HELP_SAMPLE = """\
----- common params -----

-c,    --ctx-size N                     size of the prompt context (default: 0, 0 = loaded from model)
                                        (env: LLAMA_ARG_CTX_SIZE)
--mmap, --no-mmap                       DEPRECATED in favor of `--load-mode`: whether to memory-map model.
-kvo,  --kv-offload, -nkvo, --no-kv-offload
                                        whether to enable KV cache offloading (default: enabled)
--spec-draft-hf, -hfd, -hfrd, --hf-repo-draft <user>/<model>[:quant]
                                        Same as --hf-repo, but for the draft model (default: unused)
--draft, --draft-n, --draft-max N       the argument has been removed. use --spec-draft-n-max or
                                        --spec-ngram-mod-n-max
-fa,   --flash-attn [on|off|auto]       set Flash Attention use ('on', 'off', or 'auto', default: 'auto')
"""


def test_parse_help_layouts() -> None:
    table = binaries.parse_help(HELP_SAMPLE)
    assert set(table) == {
        "ctx-size", "mmap", "no-mmap", "kv-offload", "no-kv-offload",
        "spec-draft-hf", "hf-repo-draft", "draft", "draft-n", "draft-max", "flash-attn",
    }  # fmt: skip
    assert table["ctx-size"].takes_value and not table["no-mmap"].takes_value
    assert not table["no-kv-offload"].takes_value and table["hf-repo-draft"].takes_value
    assert table["flash-attn"].takes_value  # "[on|off|auto]" still needs a value: bare --flash-attn is rejected
    assert table["draft-max"].removed and "--spec-ngram-mod-n-max" in table["draft-max"].description
    assert table["ctx-size"].description.endswith("(env: LLAMA_ARG_CTX_SIZE)")


def test_real_help_and_version(real_binary: binaries.Binary) -> None:
    known = binaries.help_options(real_binary)
    assert {"ctx-size", "cache-reuse", "no-cache-prompt", "ctx-checkpoints", "cache-ram", "kv-unified", "sleep-idle-seconds"} <= known
    assert "draft-max" not in known  # listed in --help, but removed
    assert binaries.version(real_binary) == builder.describe(builder.read_build_info(real_binary.path))


def fake_server(path: Path, help_text: str, version_line: str) -> binaries.Binary:
    """A shell script that answers --help on stdout and --version on stderr, like llama-server."""
    path.write_text(f"#!/bin/sh\nif [ \"$1\" = --help ]; then cat <<'EOF'\n{help_text}EOF\nelse echo '{version_line}' >&2; fi\n")
    path.chmod(0o755)
    return binaries.resolve_binary(str(path), source="test")


def test_help_is_cached_per_path_and_mtime(tmp_path: Path) -> None:
    binary = fake_server(tmp_path / "llama-server", HELP_SAMPLE, "version: 4567 (abc1234)")
    assert "ctx-size" in binaries.help_options(binary)
    assert binaries.version(binary) == "abc1234"
    stat = binary.path.stat()
    fake_server(binary.path, "--only-option N    the one\n", "version: 0.1.0-dev (build 1, commit 7e4c0a9)")
    os.utime(binary.path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert "ctx-size" in binaries.help_options(binary)  # same path and mtime: not run again
    os.utime(binary.path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    assert binaries.help_options(binary) == {"only-option"}
    assert binaries.version(binary) == "7e4c0a9"


def test_default_binary_is_the_portable_build_of_the_pinned_release(real_binary: binaries.Binary) -> None:
    info = builder.read_build_info(real_binary.path)
    assert info is not None and info["source"] == builder.PINNED.requirement and info["flavor"] == "cpu"
    assert "-DGGML_NATIVE=OFF" in info["cmake_args"]
    assert binaries.version(real_binary).startswith(f"b{builder.PINNED.build_number} (")


def test_default_binary_not_built_yet_says_how(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(builder.CACHE_ENV, str(tmp_path))
    with pytest.raises(BinaryError, match=r"^p\.yaml: binary: the default llama-server .* is not built yet: "
                                          r"run `reusebench build`"):
        binaries.resolve_binary("default", source="p.yaml")
    with pytest.raises(BinaryError, match=r"run `reusebench build --flavor cuda`"):
        binaries.resolve_binary("default:cuda", source="p.yaml")
    with pytest.raises(BinaryError, match=r"unknown build flavor in 'default:rocm'"):
        binaries.resolve_binary("default:rocm", source="p.yaml")


def test_resolve_binary_path_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    script = tmp_path / "llama-server"
    script.write_text("#!/bin/sh\n")
    with pytest.raises(BinaryError, match=r"^p\.yaml: binary: .* is not executable$"):
        binaries.resolve_binary(str(script), source="p.yaml")
    script.chmod(0o755)
    monkeypatch.setenv("LLAMA_BIN_DIR", str(tmp_path))
    assert binaries.resolve_binary("${LLAMA_BIN_DIR}/llama-server", source="p.yaml").path == script
    assert binaries.resolve_binary("llama-server", source="p.yaml", relative_to=tmp_path).path == script
    monkeypatch.delenv("LLAMA_BIN_DIR")
    with pytest.raises(BinaryError, match=r"^p\.yaml: binary: environment variable LLAMA_BIN_DIR is not set$"):
        binaries.resolve_binary("${LLAMA_BIN_DIR}/llama-server", source="p.yaml")
    with pytest.raises(BinaryError, match=r"^p\.yaml: binary: /nonexistent/llama-server does not exist$"):
        binaries.resolve_binary("${LLAMA_BIN_DIR:-/nonexistent}/llama-server", source="p.yaml")




def test_binary_whose_help_fails_names_the_profile(profile_dir: Path) -> None:
    broken = profile_dir / "llama-server"
    broken.write_text("#!/bin/sh\necho 'error while loading shared libraries' >&2\nexit 127\n")
    broken.chmod(0o755)
    path = write(profile_dir, "p", VALID + "binary: llama-server\noptions: {threads: 2}\n")
    message = load_error(path)
    assert message.startswith(f"{path}:3:1: binary: {broken} --help exited with 127: error while loading shared libraries")


# --- first contact -----------------------------------------------------------------------------


def test_profiles_command_shows_each_description_and_its_variants(capsys: pytest.CaptureFixture[str]) -> None:
    from reusebench import cli

    assert cli.main(["profiles"]) == 0
    lines = capsys.readouterr().out.splitlines()
    qwen = next(i for i, line in enumerate(lines) if line.startswith("tiny-qwen35 "))
    assert lines[qwen].split(None, 1)[1] == load_profile("tiny-qwen35", check_binary=False).description
    assert [line.strip() for line in lines[qwen + 1:qwen + 5]] == [
        f"--variant {v.name}" for v in load_profile("tiny-qwen35", check_binary=False).variants]
    assert next(line for line in lines if line.startswith("tiny-llama ")).endswith("control, default reuse options")


def test_help_is_plain_text_and_run_says_what_its_table_shows(capsys: pytest.CaptureFixture[str]) -> None:
    from reusebench import cli

    for argv in (["--help"], ["run", "--help"]):
        with pytest.raises(SystemExit):
            cli.main(argv)
        text = capsys.readouterr().out
        assert "``" not in text and "report A" not in text
    assert "re-processed against a perfect cache's" in " ".join(text.split())
