"""Shared by torch_mlp_step.py and torch_transformer_step.py: the command line they have in common, the optimizer,
and a training step timed as ddplab's GPU benchmarks time theirs (bench/gpu/train_step_timing.h): steps back to back,
an event at every step boundary, the median over the timed steps after the warm-up ones; and, with
torch_attention.py, the --csv file's check before any GPU work and the device time of each kernel a call launches
(kernel_times: PyTorch's profiler, what bench_cuda_kernels' device-side figures are set beside)."""
import collections
import os
import re
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


def train_step(compute_loss, opt, precision):
    """One training step: zero_grad, compute_loss() under bf16 autocast where precision is bf16, backward,
    opt.step(); returns the loss."""
    opt.zero_grad()
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=precision == "bf16"):
        loss = compute_loss()
    loss.backward()
    opt.step()
    return loss


def median_step_ms(compute_loss, opt, precision, args):
    """Median ms of a training step (zero_grad, compute_loss() under bf16 autocast where precision is bf16, backward,
    opt.step()) over args.steps steps after args.warmup; raises if the last loss is not finite."""
    total = args.warmup + args.steps
    events = [torch.cuda.Event(enable_timing=True) for _ in range(total + 1)]
    for i in range(total):
        events[i].record()
        loss = train_step(compute_loss, opt, precision)
    events[total].record()
    torch.cuda.synchronize()
    if not torch.isfinite(loss):
        raise RuntimeError("non-finite loss")
    return statistics.median(events[i].elapsed_time(events[i + 1]) for i in range(args.warmup, total))


class KernelTimesUnavailable(RuntimeError):
    """The profiler could not time the kernels here; the message is one line saying why."""


RANGE_PREFIX = "kernel_times: "  # the record_function range around each function's profiled calls


def kernel_times(fn, calls=20):
    """[(name, device ms per call)] of each CUDA kernel, memcpy and memset that fn() launches, largest first: the GPU's
    own time, without the host's time between launches that CUDA events around fn() also count. fn runs once
    unprofiled (allocations, lazy initialization, library plans), then `calls` times under torch.profiler. Raises
    KernelTimesUnavailable (one line) where the profiler cannot run or records no kernel (no CUPTI, profiling not
    permitted) or its events are not torch 2.x's."""
    return kernel_times_each({"": fn}, calls)[""]


def kernel_times_each(fns, calls=20):
    """kernel_times for each function of fns ({label: fn}) in one profiler session: several sessions started in quick
    succession are where CUPTI's teardown between them has raced. Each label's calls run in a record_function range
    ended by a synchronize, so the range spans its kernels' device time; each kernel goes to its nearest range."""
    try:
        from torch.autograd import DeviceType
        from torch.profiler import ProfilerActivity, profile, record_function
    except ImportError as e:
        raise KernelTimesUnavailable(f"torch {torch.__version__} has no torch.profiler: {e}") from None
    for fn in fns.values():
        fn()
    torch.cuda.synchronize()
    try:
        # The CPU activity too: without it some versions drop kernel events, and its names (ops, the ranges) tell
        # the GPU's copies of host annotations (record_function ranges, Optimizer.step) from the kernels.
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for label, fn in fns.items():
                with record_function(RANGE_PREFIX + label):
                    for _ in range(calls):
                        fn()
                    torch.cuda.synchronize()
        events = list(prof.events())
    except Exception as e:  # the profiler's own failure, whatever its kind, is one line for the caller
        raise KernelTimesUnavailable(f"the profiler failed: {type(e).__name__}: "
                                     f"{(str(e).splitlines() or [''])[0][:120]}") from None
    # name, device_type and time_range (elapsed_us) are FunctionEvent's in 1.13 and in 2.x; the totals
    # (cuda_time_total, renamed device_time_total in 2.x) are not read, so their renaming does not matter here.
    missing = [a for a in ("name", "device_type", "time_range") if events and not hasattr(events[0], a)]
    if missing:
        raise KernelTimesUnavailable(f"torch {torch.__version__}'s profiler events have no {', '.join(missing)} "
                                     "(read as torch 2.x's FunctionEvent)")
    host = [e for e in events if e.device_type == DeviceType.CPU]
    ranges = {e.name[len(RANGE_PREFIX):]: e.time_range for e in host if e.name.startswith(RANGE_PREFIX)}
    if set(ranges) != set(fns):
        raise KernelTimesUnavailable("the profiler recorded no range for " +
                                     ", ".join(repr(label) for label in fns if label not in ranges))
    host_names = {e.name for e in host}
    device_us = {label: collections.defaultdict(float) for label in fns}
    for e in events:
        if e.device_type != DeviceType.CUDA or getattr(e, "is_user_annotation", False) or e.name in host_names:
            continue
        start = e.time_range.start
        label = min(ranges, key=lambda lb: max(ranges[lb].start - start, start - ranges[lb].end, 0))
        device_us[label][e.name] += e.time_range.elapsed_us()
    times = {}
    for label in fns:
        if not device_us[label]:
            raise KernelTimesUnavailable("the profiler recorded no CUDA kernel" + (f" for {label}" if label else "") +
                                         " (CUPTI missing or profiling not permitted)")
        per_call = ((name, us / calls / 1e3) for name, us in device_us[label].items())
        times[label] = sorted(per_call, key=lambda kv: -kv[1])
    return times


def short_kernel_name(name, width=70):
    """A kernel's name in at most width characters. A C++ signature loses its return type, its parameter lists,
    PyTorch's and CUTLASS's namespaces and its lambdas' scaffolding, which leaves the kernel's own name and its first
    template arguments (an elementwise kernel's functor among them); then the end is cut. Memcpy and memset names
    stay as they are."""
    if name.startswith("void "):
        name = name[len("void "):]
    if "<" in name or "::" in name:
        name = re.sub(r"\(anonymous namespace\)::|\b(?:at::native|at|c10|cutlass)::", "", name)
        name = re.sub(r"::\{lambda\([^()]*\)#\d+\}|::operator\(\)\(\) const|\{lambda\([^()]*\)#\d+\}", "", name)
        while True:  # parameter lists, innermost first: "kernel<...>(Params)", "f(TensorIteratorBase&)"
            shorter = re.sub(r"(?<=[\w>])\([^()]*\)", "", name)
            if shorter == name:
                break
            name = shorter
    return name if len(name) <= width else name[:width - 3] + "..."


def kernels_csv_field(kernels):
    """kernel_times' list as one CSV field: "name=ms" joined by ';', commas (C++ template arguments) dropped."""
    return ";".join(f"{short_kernel_name(name).replace(', ', ' ').replace(',', ' ')}={ms:.4f}" for name, ms in kernels)
