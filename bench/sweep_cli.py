"""The command line the CPU sweep scripts share (train_scaling.py, overlap_sweep.py, vs_torch.py,
vs_torch_tokens.py): every bad argument is one line naming it and exit 2, before any run, as ddplab's own."""
import argparse
import os


class Parser(argparse.ArgumentParser):
    """argparse, its refusals in one line (no usage block), exit 2."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message}\n")


def positive_int(text):
    """type= for counts (--repeats, --steps, --batch): a whole number, 1 or more."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected 1 or more, got {value}")
    return value


def positive_float(text):
    """type= for durations: a number above 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected more than 0, got {text}")
    return value


def world_sizes(text):
    """type= for --np: a comma-separated list of world sizes, each 1 or more ("1,2,4")."""
    try:
        sizes = [int(n) for n in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected world sizes such as 1,2,4, got {text!r}") from None
    if any(n < 1 for n in sizes):
        raise argparse.ArgumentTypeError(f"every world size is 1 or more, got {text!r}")
    return sizes


def sizes_mb(text):
    """type= for --bucket-mb and --slice-mb lists: sizes in MiB, 0 or more, kept as typed for ddplab's flags."""
    items = text.split(",")
    try:
        if all(float(x) >= 0 for x in items):
            return items
    except ValueError:
        pass
    raise argparse.ArgumentTypeError(f"expected sizes in MiB, 0 or more, such as 0,1,5, got {text!r}")


def ddplab_path(parser, build):
    """The build's ddplab, or exit 2 naming the build that lacks it."""
    path = os.path.join(build, "launcher", "ddplab")
    if not os.access(path, os.X_OK):
        parser.error(f"--build {build}: no launcher/ddplab in it (cmake --build {build})")
    return path
