"""The CLI tests' one assertion: print each check as it is made ("ok   ..." or "FAIL ..."), keep going, and let the
script exit non-zero at the end if any failed (`failures`), so one run shows everything that is wrong."""

failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what, flush=True)
    if not ok:
        failures.append(what)
