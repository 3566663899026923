"""A CPU benchmark's rate against the hardware, for the scripts that compare runs (bench/vs_torch.py,
bench/vs_torch_tokens.py, bench/blas_kernels.sh): a ratio between two runs is put beside each run's own absolute rate,
since both sides slowed alike (on slow BLAS kernels, say) still give a healthy ratio."""
import re
import subprocess


def mlp_gemm_flops_per_sample(widths):
    """The GEMMs' FLOPs of one training step per sample of the MLP with these widths (input, hidden..., classes), as
    bench_step counts them: forward and weight gradient at every layer, the input gradient above the first (nothing
    takes the input's). Not 6 x params: that counts the first layer's input gradient and the biases, 12.7% more for
    the default MLP, and so made a step's rate exceed the probe's own rate for the same GEMMs."""
    return sum(2 * a * b * (3 if i > 0 else 2) for i, (a, b) in enumerate(zip(widths, widths[1:])))


def mlp_widths(config):
    """The widths of the MLP a ddplab run file's config (its `config` attribute, parsed) describes."""
    return [config["input_dim"]] + [config["hidden"]] * config["layers"] + [config["classes"]]


class Host:
    """What `ddplab devices` says of this host: the FMA peak per core in GFLOP/s (0 where it gives none), the BLAS
    library (its `BLAS` line) and the kernels ddplab chose (its `kernels` line)."""

    def __init__(self, ddplab):
        text = subprocess.run([ddplab, "devices"], check=True, capture_output=True, text=True).stdout
        line = lambda name: next((m.group(1) for m in re.finditer(rf"^ +{name} +(.*)$", text, re.M)), "(unknown)")
        peak = re.search(r"FMA peak ([0-9.]+) GFLOP/s", text)
        self.peak_per_core = float(peak.group(1)) if peak else 0.0
        self.cpu, self.blas, self.kernels = line("CPU"), line("BLAS"), line("kernels")

    def percent_of_peak(self, gflops, cores):
        """gflops as a share of `cores` cores' FMA peak, "12%", or "-" where the peak is unknown."""
        return f"{100 * gflops / (self.peak_per_core * cores):.0f}%" if self.peak_per_core > 0 else "-"
