#include "comm/recursive_doubling.h"

#include "comm/wire.h"

namespace ddplab {

namespace {

// Sends and receives whole buffers in the wire format; the arithmetic lives in the algorithm below.
class Exchanger {
 public:
  Exchanger(Transport& t, float* data, size_t count, RingScratch& scratch, const RingOptions& options)
      : t_(t), data_(data), count_(count), scratch_(scratch), options_(options) {
    if (options_.wire16) {
      for (auto& w : scratch_.wire)
        if (w.size() < count) w.resize(count);
    } else if (scratch_.recv.size() < count) {
      scratch_.recv.resize(count);
    }
  }

  // Rounds data to the wire format (so the value this rank adds is the one its partner receives).
  void round_to_wire() {
    if (!options_.wire16) return;
    wire::encode(options_.format, scratch_.wire[1].data(), data_, count_);
    wire::decode(options_.format, data_, scratch_.wire[1].data(), count_);
  }
  void send(int peer) {
    if (!options_.wire16) return t_.send(peer, data_, count_ * sizeof(float), options_.tag);
    wire::encode(options_.format, scratch_.wire[1].data(), data_, count_);  // exact: data is already rounded
    t_.send(peer, scratch_.wire[1].data(), count_ * sizeof(uint16_t), options_.tag);
  }
  // data = data + peer's, rounded to the wire format when there is one. The receive comes before the wait for
  // our own send (see RingPrimitives), and data is written only after that wait.
  void recv_add(int peer) {
    if (!options_.wire16) {
      t_.recv(peer, scratch_.recv.data(), count_ * sizeof(float), options_.tag);
      t_.wait_sends();
      const float* src = scratch_.recv.data();
      for (size_t i = 0; i < count_; ++i) data_[i] += src[i];
      return;
    }
    uint16_t* in = scratch_.wire[0].data();
    t_.recv(peer, in, count_ * sizeof(uint16_t), options_.tag);
    t_.wait_sends();
    wire::reduce_round(options_.format, data_, in, in, count_);
  }
  void exchange_add(int partner) {
    send(partner);
    recv_add(partner);
  }
  // data = peer's. The fp32 wire receives into data itself, which our last send may still be reading: that send is
  // waited for first.
  void recv_copy(int peer) {
    t_.wait_sends();
    if (!options_.wire16) return t_.recv(peer, data_, count_ * sizeof(float), options_.tag);
    t_.recv(peer, scratch_.wire[0].data(), count_ * sizeof(uint16_t), options_.tag);
    wire::decode(options_.format, data_, scratch_.wire[0].data(), count_);
  }

 private:
  Transport& t_;
  float* data_;
  size_t count_;
  RingScratch& scratch_;
  const RingOptions& options_;
};

}  // namespace

void recursive_doubling_allreduce_sum(float* data, size_t count, Transport& t, RingScratch& scratch,
                                      const RingOptions& options) {
  const int n = t.size();
  if (n == 1 || count == 0) return;
  Exchanger x(t, data, count, scratch, options);
  x.round_to_wire();
  run_doubling_schedule(x, n, t.rank());
  t.wait_sends();  // the hand-back's send: data may change once this returns
}

}  // namespace ddplab
