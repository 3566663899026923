#!/usr/bin/env python3
"""The instructions a kernel's main loop issues per trip, counted in its SASS: a cost measure that needs no GPU.

For every kernel of a CUDA object (or executable) whose name matches the pattern, it finds the longest loop (a
backward branch) that holds tensor-core instructions (HMMA) and counts that loop's instructions by kind. A loop without
inner loops issues each of them once per trip (a predicated one still takes its issue slot), so two builds of a kernel
can be compared before a GPU runs either: fewer instructions per tensor-core instruction, fewer issue cycles per tile.
Inner loops left in the body (BRA > 1 below) make the count a lower bound.

  bench/gpu/sass_loops.py build/kernels/cuda/CMakeFiles/ddplab_cuda.dir/flash_attention.cu.o [--kernel flash]

cuobjdump is found on PATH, in /usr/local/cuda/bin, or in the `nvidia-cuda-cuobjdump` wheel
(pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm; it runs nvdisasm from the same folder): a CUDA toolkit
may ship without either.
"""
import argparse
import collections
import glob
import os
import re
import shutil
import subprocess
import sys

KINDS = {  # opcode (before the first dot) -> the column it counts in
    "HMMA": "mma", "LDSM": "ldmatrix", "LDGSTS": "cp.async", "LDS": "ld.shared", "STS": "st.shared",
    "MUFU": "mufu", "FFMA": "fp32", "FMUL": "fp32", "FADD": "fp32", "FMNMX": "fp32", "FSETP": "fp32", "FSEL": "fp32",
    "F2FP": "cvt", "SHFL": "shfl", "BAR": "barrier", "BRA": "branch",
}
INTEGER = {"IMAD", "IADD3", "LEA", "SHF", "LOP3", "ISETP", "SEL", "MOV", "VIADD", "IABS", "PRMT", "UIADD3", "UMOV",
           "ULEA", "UIMAD", "ULDC", "S2R", "S2UR", "R2UR", "CS2R", "P2R", "R2P", "PLOP3", "IMNMX"}
COLUMNS = ["mma", "ldmatrix", "cp.async", "ld.shared", "st.shared", "mufu", "fp32", "cvt", "shfl", "integer",
           "barrier", "branch", "other"]


def die(message):
    print(f"sass_loops: {message}", file=sys.stderr)
    sys.exit(2)


def find_cuobjdump():
    found = shutil.which("cuobjdump") or next(iter(glob.glob("/usr/local/cuda/bin/cuobjdump")), None)
    if found:
        return found
    try:  # the pip wheel puts it beside its package
        import nvidia  # noqa: F401  (a namespace package; the wheel's bin/ is under one of its paths)
        for root in nvidia.__path__:
            for path in glob.glob(os.path.join(root, "*", "bin", "cuobjdump")):
                return path
    except ImportError:
        pass
    die("cuobjdump not found (PATH, /usr/local/cuda/bin, or pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm)")


def kernels(sass):
    """(mangled name, [(address, opcode, branch target or None)]) per function of the dump."""
    for block in re.split(r"\n\s*Function : ", sass)[1:]:
        name = block.split("\n", 1)[0].strip()
        code = []
        for address, text in re.findall(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);", block):
            words = text.split()
            if words and re.fullmatch(r"@!?U?P[T0-9]+", words[0]):
                words = words[1:]  # the predicate guard
            if not words:
                continue
            target = re.search(r"\b(0x[0-9a-f]+)\s*$", text) if words[0].startswith("BRA") else None
            code.append((int(address, 16), words[0], int(target.group(1), 16) if target else None))
        yield name, code


def main_loop(code):
    """The longest loop body (a backward branch's target to the branch) that holds an HMMA, or None."""
    at = {address: i for i, (address, _, _) in enumerate(code)}
    best = None
    for i, (address, _, target) in enumerate(code):
        if target is not None and target < address and target in at:
            body = code[at[target]:i + 1]
            if any(op.startswith("HMMA") for _, op, _ in body) and (best is None or len(body) > len(best)):
                best = body
    return best


def skips(loop):
    """(position in the loop, instructions jumped over) of each forward branch that lands inside the loop."""
    at = {address: i for i, (address, _, _) in enumerate(loop)}
    return [(i, at[target] - i - 1) for i, (address, _, target) in enumerate(loop)
            if target is not None and target > address and target in at]


def kind(op):
    base = op.split(".")[0]
    return KINDS.get(base) or ("integer" if base in INTEGER else "other")


def short_name(mangled):
    """flash_attention_forward_kernel<64> from _ZN...<len><name>ILi64EEEv...: the nested name's last part, and its
    integer template arguments."""
    names, i = [], 3 if mangled.startswith("_ZN") else 2
    while i < len(mangled) and mangled[i].isdigit():
        digits = re.match(r"\d+", mangled[i:]).group()
        i += len(digits)
        names.append(mangled[i:i + int(digits)])
        i += int(digits)
    arguments = re.match(r"I((?:Li-?\d+E)+)E", mangled[i:])
    suffix = "<" + ", ".join(re.findall(r"Li(-?\d+)E", arguments.group(1))) + ">" if arguments else ""
    return (names[-1] if names else mangled) + suffix


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("object", help="a CUDA object file or executable (sm_90 SASS)")
    ap.add_argument("--kernel", default="", help="only kernels whose name contains this")
    ap.add_argument("--skips", action="store_true",
                    help="also list the loop's forward branches and how many instructions each jumps over (an if "
                         "not taken, a loop's exit): the trips that take one issue that many fewer")
    args = ap.parse_args()
    dump = subprocess.run([find_cuobjdump(), "-sass", args.object], capture_output=True, text=True)
    if dump.returncode != 0 or "Function : " not in dump.stdout:
        die(f"cuobjdump -sass {args.object} gave no SASS: {dump.stderr.strip() or 'no cubin'}")
    sass = dump.stdout
    rows = []
    for mangled, code in kernels(sass):
        name = short_name(mangled)
        loop = main_loop(code)
        if args.kernel in name and loop:
            counts = collections.Counter(kind(op) for _, op, _ in loop)
            rows.append((name, len(loop), counts, skips(loop)))
    if not rows:
        die(f"no kernel matching '{args.kernel}' with a tensor-core loop in {args.object}")
    width = max(len(name) for name, *_ in rows)
    print(f"{'kernel':{width}s} {'loop':>5s} {'per mma':>7s} " + " ".join(f"{c:>9s}" for c in COLUMNS))
    for name, total, counts, jumps in sorted(rows):
        columns = " ".join(f"{counts[c]:9d}" for c in COLUMNS)
        print(f"{name:{width}s} {total:5d} {total / counts['mma']:7.2f} {columns}")
        if args.skips:
            print(f"{'':{width}s} skips: " + ", ".join(f"{n} from +{at}" for at, n in jumps))


if __name__ == "__main__":
    main()
