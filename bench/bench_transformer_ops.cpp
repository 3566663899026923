// Transformer op benchmark at two shapes: the `tiny` preset's (the token-skew lab: B 32, S 256, d_model 48, 4 heads,
// MLP 96, vocab 8192) and one GPT-2-small block (B 4, S 512, d_model 768, 12 heads, MLP 3072). Time per call
// (median of repeats) and achieved GFLOP/s (GEMM-based ops, FLOPs as computed) or GB/s (bytes read + written);
// then a whole Transformer<float> training step (forward + backward) of the tiny model in useful tokens/s.
//   bench_transformer_ops [--repeats 10] [--shapes tiny|gpt2|all] [--batch B] [--seq S]
// --batch and --seq override the tiny shape's B 32 and S 256 (ops and model step; S <= 256, the preset's max_len):
// `ddplab suite tokens` runs 16 sequences per rank, so `--batch 16 --seq 128` and `--seq 256` are its shapes.
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "bench/bench_cli.h"
#include "bench/bench_util.h"
#include "kernels/cpu/blas_kernels.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/rng.h"
#include "kernels/cpu/transformer_ops.h"
#include "model/transformer.h"

using namespace ddplab;

namespace {

using bench::median_ms;
using bench::random_vector;

void row(const char* name, const std::string& shape, double ms, double amount, const char* unit) {
  std::printf("%-30s %-26s %9.3f ms %9.1f %s\n", name, shape.c_str(), ms, amount / (ms * 1e-3) / 1e9, unit);
}

// The token-skew lab's length distribution, scaled to S: log-uniform [S/4, S] with 8% at S.
std::vector<int32_t> lab_lengths(int B, int S) {
  std::vector<int32_t> len(B);
  for (int b = 0; b < B; ++b) {
    len[b] = hash64(13, b) % 100 < 8 ? S : static_cast<int32_t>(S / 4.0 * std::pow(4.0, uniform01(12, b)));
  }
  return len;
}

struct Shape {
  const char* name;
  int B, S, C, NH, H, V;
};

void bench_ops(const Shape& s, int repeats) {
  const int B = s.B, S = s.S, C = s.C, NH = s.NH, H = s.H, V = s.V, BT = B * S;
  const int64_t BTC = int64_t(BT) * C;
  // One output row: the lambda last, so each call reads as name, shape, amount of work, then the work.
  auto time = [&](const char* name, const std::string& shape, double amount, const char* unit,
                  const std::function<void()>& fn) { row(name, shape, median_ms(fn, repeats), amount, unit); };
  char buf[96];
  std::snprintf(buf, sizeof buf, "B%d S%d C%d", B, S, C);
  const std::string bsc = buf;
  std::printf("# %s: B %d, S %d, d_model %d, heads %d, MLP %d, vocab %d\n", s.name, B, S, C, NH, H, V);

  std::vector<int32_t> tokens(BT), lengths(B, S);
  for (int i = 0; i < BT; ++i) tokens[i] = static_cast<int32_t>(hash64(1, i) % V);
  auto wte = random_vector(size_t(V) * C, 2, 0.02), wpe = random_vector(size_t(S) * C, 3, 0.02);
  auto dwte = wte, dwpe = wpe;
  auto x = random_vector(BTC, 4), out = random_vector(BTC, 5), dout = random_vector(BTC, 6), dx = out;
  time("embedding_forward", bsc, 3.0 * 4 * BTC, "GB/s",
       [&] { cpu::embedding_forward(out.data(), tokens.data(), lengths.data(), wte.data(), wpe.data(), B, S, C); });
  time("embedding_backward", bsc, 5.0 * 4 * BTC, "GB/s",
       [&] { cpu::embedding_backward(dwte.data(), dwpe.data(), dout.data(), tokens.data(), lengths.data(), B, S, C); });

  auto lnw = random_vector(C, 7), lnb = random_vector(C, 8), dlnw = lnw, dlnb = lnb;
  std::vector<float> mean(BT), rstd(BT);
  time("layernorm_forward", bsc, 2.0 * 4 * BTC, "GB/s",
       [&] { cpu::layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), lnw.data(), lnb.data(), BT, C); });
  time("layernorm_backward", bsc, 4.0 * 4 * BTC, "GB/s", [&] {
    cpu::layernorm_backward(dx.data(), dlnw.data(), dlnb.data(), dout.data(), x.data(), lnw.data(), mean.data(),
                            rstd.data(), BT, C);
  });

  auto wqkv = random_vector(size_t(3) * C * C, 9, 0.1), qkv = random_vector(3 * BTC, 10);
  std::snprintf(buf, sizeof buf, "%dx%d @ %dx%d^T", BT, C, 3 * C, C);
  time("matmul_forward (qkv)", buf, 2.0 * BT * C * 3 * C, "GFLOP/s",
       [&] { cpu::matmul_forward(qkv.data(), x.data(), wqkv.data(), BT, C, 3 * C); });

  qkv = random_vector(3 * BTC, 11);
  std::vector<float> att(size_t(B) * NH * S * S), dqkv(3 * BTC);
  std::snprintf(buf, sizeof buf, "B%d S%d C%d NH%d", B, S, C, NH);
  const double att_flops = 4.0 * B * double(S) * S * C;  // QK^T and PV, the full square as computed
  for (bool causal : {false, true}) {
    time(causal ? "attention_forward (causal)" : "attention_forward", buf, att_flops, "GFLOP/s",
         [&] { cpu::attention_forward(out.data(), att.data(), qkv.data(), lengths.data(), B, S, C, NH, causal); });
    time(causal ? "attention_backward (causal)" : "attention_backward", buf, 2 * att_flops, "GFLOP/s", [&] {
      cpu::attention_backward(dqkv.data(), dout.data(), qkv.data(), att.data(), lengths.data(), B, S, C,
                              NH, causal);
    });
  }
  // The token-skew lab's lengths: log-uniform [S/4, S] with 8% at S; only valid keys and queries cost FLOPs.
  std::vector<int32_t> skewed = lab_lengths(B, S);
  double useful = 0;
  for (int32_t l : skewed) useful += 4.0 * double(l) * l * C;
  time("attention_forward (lab lengths)", buf, useful, "GFLOP/s",
       [&] { cpu::attention_forward(out.data(), att.data(), qkv.data(), skewed.data(), B, S, C, NH, false); });

  std::vector<float> hg(size_t(BT) * H);
  auto hin = random_vector(size_t(BT) * H, 14);
  std::snprintf(buf, sizeof buf, "%dx%d", BT, H);
  time("gelu_forward (mlp)", buf, 2.0 * 4 * BT * H, "GB/s",
       [&] { cpu::gelu_forward(hg.data(), hin.data(), int64_t(BT) * H); });

  std::vector<float> pooled(size_t(B) * C);
  time("mean_pool_forward", bsc, 4.0 * BTC, "GB/s",
       [&] { cpu::mean_pool_forward(pooled.data(), x.data(), lengths.data(), B, S, C); });
  time("mean_pool_backward", bsc, 4.0 * BTC, "GB/s",
       [&] { cpu::mean_pool_backward(dx.data(), pooled.data(), lengths.data(), B, S, C); });

  // LM head cross-entropy over [rows, V], every row valid but the last of each sequence (buffer capped at 64 MB).
  std::vector<int32_t> targets(BT);
  for (int i = 0; i < BT; ++i) targets[i] = i % S == S - 1 ? -1 : tokens[i + 1];
  const int rows_lm = static_cast<int>(std::min<int64_t>(BT, (int64_t(1) << 24) / V));
  auto logits = random_vector(size_t(rows_lm) * V, 15), exps = logits, losses = random_vector(rows_lm, 16);
  std::vector<float> sums(rows_lm);
  std::snprintf(buf, sizeof buf, "%dx%d", rows_lm, V);
  time("softmax_xent_forward (LM)", buf, 8.0 * rows_lm * V, "GB/s", [&] {
    cpu::softmax_cross_entropy_forward(exps.data(), sums.data(), losses.data(), logits.data(), targets.data(), rows_lm,
                                       V);
  });
  time("softmax_xent_backward (LM)", buf, 8.0 * rows_lm * V, "GB/s", [&] {
    cpu::softmax_cross_entropy_backward(logits.data(), exps.data(), sums.data(), targets.data(), rows_lm, V);
  });
}

// One training step of the tiny preset (classifier): forward + backward, at full length and at the lab's lengths.
void bench_model(int repeats, int B, int S) {
  const TransformerConfig c = TransformerConfig::preset("tiny");
  Transformer<float> model(c, 1);
  std::vector<int32_t> tokens(B * S), targets(B), full(B, S), skewed = lab_lengths(B, S);
  for (int i = 0; i < B * S; ++i) tokens[i] = static_cast<int32_t>(hash64(21, i) % c.vocab);
  for (int b = 0; b < B; ++b) targets[b] = static_cast<int32_t>(hash64(22, b) % c.num_classes);
  std::printf("# tiny model step (forward + backward), %lld parameters\n",
              static_cast<long long>(model.num_parameters()));
  for (const auto* lens : {&full, &skewed}) {
    int64_t useful = 0;
    for (int32_t l : *lens) useful += l;
    const double ms = median_ms(
        [&] {
          model.forward(tokens.data(), lens->data(), targets.data(), B, S);
          model.zero_grad();
          model.backward();
        },
        repeats);
    char shape[64];
    std::snprintf(shape, sizeof shape, "B%d S%d, %lld useful tok", B, S, static_cast<long long>(useful));
    std::printf("%-30s %-26s %9.3f ms %9.0f useful tok/s %9.0f padded tok/s\n",
                lens == &full ? "tiny step (full length)" : "tiny step (lab lengths)", shape, ms, useful / (ms * 1e-3),
                B * S / (ms * 1e-3));
  }
}

}  // namespace

int main(int argc, char** argv) {
  blas::select_kernels(argc, argv);  // the kernels ddplab runs here (and this program is also the probe's child)
  int repeats = 10, batch = 32, seq = 256;
  std::string shapes = "all";
  CLI::App app{"the transformer's ops at the tiny preset's and a GPT-2-small block's shapes, and a tiny step"};
  app.add_option("--repeats", repeats, "timed calls per op (median)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  app.add_option("--shapes", shapes, "tiny, gpt2 or all")
      ->capture_default_str()
      ->check(CLI::IsMember({"tiny", "gpt2", "all"}));
  app.add_option("--batch", batch, "the tiny shape's sequences")->capture_default_str()->check(CLI::Range(1, 1 << 16));
  app.add_option("--seq", seq, "the tiny shape's tokens per sequence, at most the preset's max_len")
      ->capture_default_str()
      ->check(CLI::Range(1, 256));
  if (const auto code = bench::parse_command_line(app, argc, argv, "bench_transformer_ops")) return *code;
  openblas_set_num_threads(1);
  std::printf("# bench_transformer_ops: 1 BLAS thread, OpenBLAS kernels %s\n",
              blas::kernels_in_use().describe().c_str());
  std::printf("%-30s %-26s %12s %14s\n", "op", "shape", "time", "rate");
  if (shapes == "tiny" || shapes == "all") {
    bench_ops({"tiny", batch, seq, 48, 4, 96, 8192}, repeats);
    bench_model(repeats, batch, seq);
  }
  if (shapes == "gpt2" || shapes == "all") bench_ops({"gpt2-small block", 4, 512, 768, 12, 3072, 50257}, repeats);
  return 0;
}
