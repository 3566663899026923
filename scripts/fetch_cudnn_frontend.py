#!/usr/bin/env python3
"""Fetches the cuDNN frontend's C++ headers (header-only; shipped under include/ in PyPI's nvidia-cudnn-frontend
wheel) into DEST/include, for the --attention cudnn path. Pinned to one version and checked against PyPI's sha256;
written to a temporary folder first and renamed, so DEST is either complete or absent. Needs only python3.

  scripts/fetch_cudnn_frontend.py [DEST]        default: .deps/cudnn-frontend of this checkout
"""
import hashlib
import io
import json
import os
import shutil
import sys
import tempfile
import urllib.request
import zipfile

VERSION = "1.32.0"
PACKAGE = "nvidia-cudnn-frontend"


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    dest = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(root, ".deps", "cudnn-frontend"))
    if os.path.isfile(os.path.join(dest, "include", "cudnn_frontend.h")):
        return 0
    # PyPI's simple index (PEP 691, JSON), what pip itself reads.
    index = urllib.request.Request(f"https://pypi.org/simple/{PACKAGE}/",
                                   headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    with urllib.request.urlopen(index, timeout=60) as r:
        files = json.load(r)["files"]
    # Any wheel of the version holds the same headers; take a Linux x86-64 one.
    prefix = f"{PACKAGE.replace('-', '_')}-{VERSION}-"
    wheels = [f for f in files if f["filename"].startswith(prefix) and f["filename"].endswith(".whl")
              and "x86_64" in f["filename"] and not f.get("yanked")]
    if not wheels:
        print(f"fetch_cudnn_frontend: no x86-64 wheel of {PACKAGE} {VERSION} on PyPI", file=sys.stderr)
        return 1
    wheel = wheels[0]
    with urllib.request.urlopen(wheel["url"], timeout=300) as r:
        data = r.read()
    if hashlib.sha256(data).hexdigest() != wheel["hashes"]["sha256"]:
        print(f"fetch_cudnn_frontend: {wheel['filename']}: sha256 does not match PyPI's", file=sys.stderr)
        return 1
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    staging = tempfile.mkdtemp(prefix=".cudnn-frontend.", dir=os.path.dirname(dest))
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as z:
            members = [m for m in z.namelist() if m.startswith("include/")]
            z.extractall(staging, members)
        with open(os.path.join(staging, "VERSION"), "w") as f:
            f.write(f"{PACKAGE} {VERSION} ({wheel['filename']})\n")
        shutil.rmtree(dest, ignore_errors=True)
        os.rename(staging, dest)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    print(f"fetch_cudnn_frontend: {PACKAGE} {VERSION} headers in {dest}/include")
    return 0


if __name__ == "__main__":
    sys.exit(main())
