#!/usr/bin/env python3
"""check_architecture.py itself: a page naming a file that is not there, or leaving a source folder out, fails.

Usage: test_check_architecture.py [REPO_ROOT]
"""
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import check_architecture  # noqa: E402


def main(argv):
    root = os.path.abspath(argv[1] if len(argv) > 1 else os.path.join(os.path.dirname(__file__), "..", ".."))
    page = open(os.path.join(root, "docs", "ARCHITECTURE.md"), encoding="utf-8").read()
    cases = {
        # a path under a top-level folder, a bare source name, a file outside the repository
        "train/no_such_file.cpp": "names train/no_such_file.cpp",
        "the removed no_such_trainer.cpp": "names no_such_trainer.cpp",
        "see shared/NO_SUCH.md": "names shared/NO_SUCH.md",
    }
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        for added, expected in cases.items():
            doc = os.path.join(tmp, "page.md")
            with open(doc, "w", encoding="utf-8") as f:
                f.write(page + "\n" + added + "\n")
            found = check_architecture.problems(root, doc)
            if not any(expected in line for line in found):
                failures.append(f"adding '{added}' was not reported (got {found})")
        # every mention of one source folder removed
        doc = os.path.join(tmp, "page.md")
        with open(doc, "w", encoding="utf-8") as f:
            f.write(page.replace("tests/emu", "tests/elsewhere"))
        found = check_architecture.problems(root, doc)
        if not any("does not describe the source folder tests/emu/" in line for line in found):
            failures.append(f"removing tests/emu was not reported (got {found})")
    for line in failures:
        print(line)
    print("check_architecture.py reports every planted problem" if not failures else "FAILED")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
