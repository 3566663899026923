// The readiness-hook contract every model's backward keeps (model/parameters.h, GradReadyHook): on_ready(k) once per
// gradient piece, in grad_pieces() order, and nothing written to a piece after it was declared ready.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "model/parameters.h"

namespace ddplab::test {

// Runs model.backward() after the caller's forward, snapshotting each piece when its hook fires, and checks order
// and finality. Returns each piece's L1 norm: a zero snapshot would match a never-written gradient trivially, so
// callers check the pieces that must carry gradient are nonzero.
template <typename Model>
std::vector<double> CheckReadyHookOrderAndFinality(Model& model) {
  model.zero_grad();
  const auto& pieces = model.grad_pieces();
  std::vector<int> order;
  std::vector<std::vector<double>> snapshot(pieces.size());
  model.backward([&](int k) {
    order.push_back(k);
    const GradPiece& g = pieces.at(k);
    snapshot[k].assign(model.flat_grads() + g.offset, model.flat_grads() + g.offset + g.numel);
  });
  EXPECT_EQ(order.size(), pieces.size());
  for (size_t k = 0; k < order.size(); ++k) EXPECT_EQ(order[k], static_cast<int>(k)) << "call " << k;
  std::vector<double> norms(pieces.size());
  for (size_t k = 0; k < pieces.size() && k < order.size(); ++k) {
    for (int64_t i = 0; i < pieces[k].numel; ++i) {
      EXPECT_EQ(snapshot[k][i], model.flat_grads()[pieces[k].offset + i]) << "piece " << k << "[" << i << "]";
      norms[k] += std::abs(snapshot[k][i]);
    }
  }
  return norms;
}

}  // namespace ddplab::test
