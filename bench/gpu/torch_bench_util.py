"""Shared by torch_mlp_step.py and torch_transformer_step.py: the command line they have in common, the optimizer,
and a training step timed as ddplab's GPU benchmarks time theirs (bench/gpu/train_step_timing.h): steps back to back,
an event at every step boundary, the median over the timed steps after the warm-up ones; and, with
torch_attention.py, the --csv file's check before any GPU work."""
import os
import statistics
import sys
import tempfile

import torch


def add_common_args(ap, steps, warmup):
    """--steps, --warmup (with these defaults), --precision, --adamw and --csv."""
    ap.add_argument("--steps", type=int, default=steps)
    ap.add_argument("--warmup", type=int, default=warmup)
    ap.add_argument("--precision", choices=["fp32", "tf32", "bf16"], help="one precision instead of all three")
    ap.add_argument("--adamw", choices=["fused", "foreach"], default="fused")
    ap.add_argument("--csv")


def refuse_unwritable(path):
    """Exits 2 with one line where the --csv file cannot be written: found before the GPU's work, not after it."""
    if not path:
        return
    try:
        if os.path.isdir(path):
            raise OSError(0, "a folder (name a file)")
        if os.path.exists(path) and not os.access(path, os.W_OK):
            raise OSError(0, "not writable")
        tempfile.TemporaryFile(dir=os.path.dirname(path) or ".").close()  # the folder exists and takes a file
    except OSError as e:
        print(f"{os.path.basename(sys.argv[0])}: --csv {path}: {e.strerror}", file=sys.stderr)
        sys.exit(2)


def precisions(args):
    return [args.precision] if args.precision else ["fp32", "tf32", "bf16"]


def print_device():
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}, CUDA {torch.version.cuda}")


def adamw(parameters, args):
    """AdamW as ddplab's (lr 1e-3, weight decay 0.01): fused (one kernel, as ddplab's) or PyTorch's foreach."""
    fused = args.adamw == "fused"
    return torch.optim.AdamW(parameters, lr=1e-3, weight_decay=0.01, fused=fused, foreach=not fused)


def median_step_ms(compute_loss, opt, precision, args):
    """Median ms of a training step (zero_grad, compute_loss() under bf16 autocast where precision is bf16, backward,
    opt.step()) over args.steps steps after args.warmup; raises if the last loss is not finite."""
    total = args.warmup + args.steps
    events = [torch.cuda.Event(enable_timing=True) for _ in range(total + 1)]
    for i in range(total):
        events[i].record()
        opt.zero_grad()
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=precision == "bf16"):
            loss = compute_loss()
        loss.backward()
        opt.step()
    events[total].record()
    torch.cuda.synchronize()
    if not torch.isfinite(loss):
        raise RuntimeError("non-finite loss")
    return statistics.median(events[i].elapsed_time(events[i + 1]) for i in range(args.warmup, total))
