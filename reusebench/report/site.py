"""A self-contained asv site: the JavaScript libraries asv's index.html takes from public CDNs, served locally.

asv 0.6.6's index.html loads jQuery, flot, flot-orderbars, stupidtable, blueimp-md5 and
bootstrap from CDNs; without internet access (a lab network, a laptop on a plane) the
site shows only "One or more external (JavaScript) dependencies of airspeed velocity
failed to load". `fetch()` (at setup: `make site-assets`) takes the same libraries from
the npm registry with `npm pack`, checks each tarball against its pinned sha256, and
keeps the files under the cache; `make_self_contained()` (after every `asv publish`)
copies them into the site and points index.html at them. Nothing is downloaded then.

Where npm has the very file the CDN serves, index.html keeps asv's own `integrity`
attribute, so the browser checks it too (and `make_self_contained` checks it first). npm
has flot 0.8.3 only unminified (the CDN's .min.js files are the CDN's own minification)
and stupidtable only as stupid-table-plugin 1.1.3 (the CDN's is 1.0.1, the same jQuery
plugin API); those tags lose the attribute and rely on the tarball's hash.

    python -m reusebench.report.site fetch            # setup: npm pack into the cache
    python -m reusebench.report.site vendor SITE_DIR  # after asv publish
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

CACHE_ENV = "REUSEBENCH_SITE_ASSETS"
VENDOR_DIR = "vendor"  # in the published site


@dataclass(frozen=True)
class NpmPackage:
    name: str
    version: str
    sha256: str  # of the tarball `npm pack` writes

    @property
    def spec(self) -> str:
        return f"{self.name}@{self.version}"

    @property
    def tarball(self) -> str:
        return f"{self.name}-{self.version}.tgz"


@dataclass(frozen=True)
class Asset:
    """One file index.html loads from a CDN, and where npm has it."""

    cdn_url: str
    package: NpmPackage
    member: str  # path inside the npm tarball
    same_as_cdn: bool  # byte for byte the CDN's file, so asv's integrity attribute holds

    @property
    def local(self) -> str:
        return f"{VENDOR_DIR}/{self.package.spec}/{Path(self.member).name}"


JQUERY = NpmPackage("jquery", "3.3.1", "2c7c70a1e796c1568ff05d45a8cb2da2a0fc6e37426c65e4eef6ee55e217933e")
FLOT = NpmPackage("flot", "0.8.3", "5e4cea78a9efa2d3dbba363ac76c688951e6c638ee916883c36e23516208b1ed")
ORDERBARS = NpmPackage("flot-orderbars", "1.0.0", "e5523ee7cca778f194b34fc31afb6dda40bf1557e6669fda4730c29f53e87101")
STUPIDTABLE = NpmPackage("stupid-table-plugin", "1.1.3",
                         "1186089584b7c2f7fec9ad4232e9aa1adbfea273eaa233b713beb8c2c916b4ac")
MD5 = NpmPackage("blueimp-md5", "2.19.0", "0fff5798c7733b21f3e4c0de69ccba12af266e0f01c3e3a41051c0e49a655512")
BOOTSTRAP = NpmPackage("bootstrap", "3.1.1", "23b27da4dd80b8fbe8972ac4be87037627e007ad5dd1edb27435844f0a4646a0")

CDNJS_FLOT = "https://cdnjs.cloudflare.com/ajax/libs/flot/0.8.3"
ASSETS = (
    Asset("https://code.jquery.com/jquery-3.3.1.min.js", JQUERY, "package/dist/jquery.min.js", True),
    *(Asset(f"{CDNJS_FLOT}/jquery.flot{part}.min.js", FLOT, f"package/jquery.flot{part}.js", False)
      for part in ("", ".time", ".selection", ".categories")),
    Asset("https://cdn.jsdelivr.net/npm/flot-orderbars@1.0.0/js/jquery.flot.orderBars.js", ORDERBARS,
          "package/js/jquery.flot.orderBars.js", True),
    Asset("https://cdnjs.cloudflare.com/ajax/libs/stupidtable/1.0.1/stupidtable.min.js", STUPIDTABLE,
          "package/stupidtable.min.js", False),
    Asset("https://cdnjs.cloudflare.com/ajax/libs/blueimp-md5/2.19.0/js/md5.min.js", MD5, "package/js/md5.min.js",
          True),
    Asset("https://cdn.jsdelivr.net/npm/bootstrap@3.1.1/dist/js/bootstrap.min.js", BOOTSTRAP,
          "package/dist/js/bootstrap.min.js", True),
    Asset("https://cdn.jsdelivr.net/npm/bootstrap@3.1.1/dist/css/bootstrap.min.css", BOOTSTRAP,
          "package/dist/css/bootstrap.min.css", True),
)
PACKAGES = tuple(dict.fromkeys(asset.package for asset in ASSETS))

# A <script src=...> or <link href=...> tag that loads from outside the site.
_EXTERNAL_TAG = re.compile(r'<(script|link)\b[^>]*\b(?:src|href)="(https?://[^"]+)"[^>]*>')
_INTEGRITY = re.compile(r'\bintegrity="([^"]+)"')


class SiteError(Exception):
    """The site cannot be made self-contained; the message says why and what to do."""


def cache_dir() -> Path:
    """`$REUSEBENCH_SITE_ASSETS`, else `~/.cache/reusebench/asv-site-assets`."""
    configured = os.environ.get(CACHE_ENV)
    return Path(configured) if configured else Path.home() / ".cache" / "reusebench" / "asv-site-assets"


def fetch(into: Path | None = None) -> Path:
    """npm-pack every package not yet cached, each checked against its pinned sha256; the cache directory."""
    into = into or cache_dir()
    into.mkdir(parents=True, exist_ok=True)
    for package in PACKAGES:
        target = into / package.tarball
        if target.is_file() and _sha256(target.read_bytes()) == package.sha256:
            continue
        if shutil.which("npm") is None:
            raise SiteError("npm not found: the asv site's libraries come from the npm registry (apt-get install npm)")
        with tempfile.TemporaryDirectory(dir=into) as scratch:
            done = subprocess.run(["npm", "pack", "--silent", package.spec], cwd=scratch, capture_output=True,
                                  text=True)
            packed = Path(scratch) / package.tarball
            if done.returncode != 0 or not packed.is_file():
                raise SiteError(f"npm pack {package.spec} failed: {done.stderr.strip()[-500:]}")
            digest = _sha256(packed.read_bytes())
            if digest != package.sha256:
                raise SiteError(f"npm pack {package.spec}: sha256 {digest}, pinned {package.sha256}")
            packed.replace(target)
    return into


def make_self_contained(site: Path, assets: Path | None = None) -> list[str]:
    """Copy the cached libraries into the published `site` and point its index.html at them; the local paths.

    Run after every `asv publish`, which rewrites index.html.
    """
    assets = assets or cache_dir()
    index = site / "index.html"
    html = index.read_text()
    by_url = {asset.cdn_url: asset for asset in ASSETS}
    unknown = [url for _, url in _EXTERNAL_TAG.findall(html) if url not in by_url]
    if unknown:
        raise SiteError(f"{index} loads {', '.join(unknown)}, which reusebench.report.site does not vendor "
                        "(another asv version?): add it to ASSETS")
    tarballs: dict[NpmPackage, tarfile.TarFile] = {}
    try:
        for package in PACKAGES:
            path = assets / package.tarball
            if not path.is_file() or _sha256(path.read_bytes()) != package.sha256:
                raise SiteError(f"{path}: missing or not the pinned tarball; run `make site-assets` "
                                "(python -m reusebench.report.site fetch)")
            tarballs[package] = tarfile.open(path)

        def local_tag(match: re.Match[str]) -> str:
            tag, url = match.group(0), match.group(2)
            asset = by_url[url]
            member = tarballs[asset.package].extractfile(asset.member)
            assert member is not None, asset.member  # a file, checked when the assets were fetched
            data = member.read()
            integrity = _INTEGRITY.search(tag)
            if asset.same_as_cdn and integrity and _sri(data, integrity.group(1)) != integrity.group(1):
                raise SiteError(f"{asset.package.spec} {asset.member} is not the file index.html pins for {url}")
            target = site / asset.local
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
            tag = tag.replace(url, asset.local)
            # Same origin: no CORS. The CDN's integrity only holds for the CDN's very file.
            tag = re.sub(r'\s(crossorigin|referrerpolicy)="[^"]*"', "", tag)
            return tag if asset.same_as_cdn else _INTEGRITY.sub("", tag).replace("  ", " ")

        html = _EXTERNAL_TAG.sub(local_tag, html)
    finally:
        for archive in tarballs.values():
            archive.close()
    index.write_text(html)
    return sorted({asset.local for asset in ASSETS})


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _sri(data: bytes, like: str) -> str:
    """A subresource-integrity value of `data` with the algorithm of `like` ("sha256-...", "sha512-...")."""
    algorithm = like.split("-", 1)[0]
    return f"{algorithm}-{base64.b64encode(hashlib.new(algorithm, data).digest()).decode()}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m reusebench.report.site", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("fetch", help="npm pack the libraries into the cache (setup)")
    vendor = sub.add_parser("vendor", help="copy them into a published asv site and point index.html at them")
    vendor.add_argument("site", type=Path, help="the asv html_dir, e.g. results/html")
    args = parser.parse_args(argv)
    try:
        if args.command == "fetch":
            print(fetch())
        else:
            for local in make_self_contained(args.site):
                print(args.site / local)
    except SiteError as error:
        print(f"reusebench.report.site: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
