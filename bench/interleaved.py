"""Two sides timed against each other on one machine (vs_torch.py, vs_torch_tokens.py): their runs alternate so that
both see the same load, and a peer run that fails or hangs is counted and left out rather than ending the table."""
import json
import subprocess


def alternate(repeats, ours, theirs):
    """ours() and theirs() run in turn, repeats times each. ours() returns its result; theirs() returns its result,
    or None when the run failed. Returns ours' results, theirs' results without the failures, and their count."""
    our_results, their_results, failed = [], [], 0
    for _ in range(repeats):
        our_results.append(ours())
        result = theirs()
        if result is None:
            failed += 1
        else:
            their_results.append(result)
    return our_results, their_results, failed


def last_json_line(cmd, env=None):
    """The JSON object a peer script prints on its last line, or None when it failed or printed nothing."""
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        return None
    return json.loads(lines[-1])
