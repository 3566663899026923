"""The CLI tests' one assertion: print each check as it is made ("ok   ..." or "FAIL ..."), keep going, and let the
script exit non-zero at the end if any failed (`failures`), so one run shows everything that is wrong. A check that
the host cannot make (busy with other work, a kernel without a counter) is `skip`ped with the reason: then the test
ends as skipped (exit 77, each such test's SKIP_RETURN_CODE), never as passed."""

failures = []
skips = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what, flush=True)
    if not ok:
        failures.append(what)


def skip(what):
    print("skip " + what, flush=True)
    skips.append(what)


def exit_code():
    """1 when a check failed, else 77 when one was skipped, else 0."""
    return 1 if failures else 77 if skips else 0
