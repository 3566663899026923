#!/usr/bin/env python3
"""docs/ARCHITECTURE.md matches the tree: every repository path it names exists, and every folder holding C++/CUDA
sources is named in it.

Usage: check_architecture.py [REPO_ROOT [DOC]]   (defaults: this file's repository, docs/ARCHITECTURE.md)

A path is a token with a slash whose first part is a top-level entry of the repository or that ends in a file
extension (`train/trainer.cpp`, `comm/`, `shared/DESIGN.md`), or a bare file name with a source extension
(`trainer.cpp`), which must exist somewhere in the repository. Exit 0 when the page matches, 1 with one line per
problem when it does not, 2 on bad arguments.
"""
import os
import re
import subprocess
import sys

SOURCE_EXTENSIONS = (".cpp", ".h", ".cu", ".cuh")
FILE_EXTENSIONS = SOURCE_EXTENSIONS + (".py", ".sh", ".md", ".txt", ".json", ".cmake", ".yml")
# Headers of the libraries ddplab builds on: named in the page, not part of the repository.
EXTERNAL_FILES = {"cublasLt.h", "cublas_v2.h", "cudnn.h", "nccl.h", "mpi.h", "hdf5.h", "cblas.h", "cuda_runtime.h"}
# A token: starts with a letter or underscore, not right after a word character, a dot, a slash, `$` or `~`
# (so `$XDG_CACHE_HOME/ddplab/` and `~/.cache/` are not paths of ours).
TOKEN = re.compile(r"(?<![\w./$~<-])([A-Za-z_][\w.+-]*(?:/[\w.+-]+)*/?)")


def repository_files(root):
    """Tracked and untracked-but-not-ignored files, relative to root; a plain walk where git is unavailable."""
    try:
        out = subprocess.run(["git", "-C", root, "ls-files", "--cached", "--others", "--exclude-standard"],
                             check=True, capture_output=True, text=True).stdout
        files = [f for f in out.splitlines() if os.path.exists(os.path.join(root, f))]
        if files:
            return files
    except (OSError, subprocess.CalledProcessError):
        pass
    files = []
    for folder, dirs, names in os.walk(root):
        dirs[:] = [d for d in dirs if not d.startswith(".") and not d.startswith("build")]
        files += [os.path.relpath(os.path.join(folder, n), root) for n in names]
    return files


def named_paths(text, top_level):
    """The tokens of the page that name a repository path (see the module's docstring)."""
    for token in TOKEN.findall(text):
        token = token.rstrip(".")  # a sentence's full stop
        if "/" in token:
            first = token.split("/", 1)[0]
            if first in top_level or token.endswith(FILE_EXTENSIONS):
                yield token
        elif token.endswith(SOURCE_EXTENSIONS) and token not in EXTERNAL_FILES:
            yield token


def problems(root, doc):
    files = repository_files(root)
    paths = set(files)
    folders = {os.path.dirname(f) for f in files}
    for f in list(folders):
        while f:
            f = os.path.dirname(f)
            folders.add(f)
    basenames = {os.path.basename(f) for f in files}
    top_level = {f.split("/", 1)[0] for f in files}
    text = open(doc, encoding="utf-8").read()

    found = []
    for token in sorted(set(named_paths(text, top_level))):
        if "/" in token:
            exists = token.rstrip("/") in paths or token.rstrip("/") in folders
        else:
            exists = token in basenames
        if not exists:
            found.append(f"{os.path.relpath(doc, root)} names {token}, which is not in the repository")

    source_folders = sorted({os.path.dirname(f) for f in files if f.endswith(SOURCE_EXTENSIONS)} - {""})
    for folder in source_folders:
        # The folder itself, as `kernels/cpu` or `kernels/cpu/`, not only a file inside it.
        if not re.search(r"(?<![\w./-])" + re.escape(folder) + r"(?!/?[\w.-])", text):
            found.append(f"{os.path.relpath(doc, root)} does not describe the source folder {folder}/")
    return found


def main(argv):
    if len(argv) > 3:
        print("usage: check_architecture.py [REPO_ROOT [DOC]]", file=sys.stderr)
        return 2
    root = os.path.abspath(argv[1] if len(argv) > 1 else os.path.join(os.path.dirname(__file__), "..", ".."))
    doc = argv[2] if len(argv) > 2 else os.path.join(root, "docs", "ARCHITECTURE.md")
    if not os.path.isdir(root) or not os.path.isfile(doc):
        print(f"check_architecture.py: no repository at {root} or no page at {doc}", file=sys.stderr)
        return 2
    found = problems(root, doc)
    for line in found:
        print(line)
    if not found:
        print(f"{os.path.relpath(doc, root)} matches the tree")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
