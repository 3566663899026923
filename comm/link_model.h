// The emulated interconnect as data: what a run's links were, which the run file stores and the predictor reads, apart
// from the Communicator that emulates them.
#pragma once
#include <string>

namespace ddplab {

// An emulated interconnect: each message is delayed by latency + bytes / bandwidth without burning CPU
// (comm/link_emulation.h, docs/COMM.md). latency 0 and gbps 0: no emulation; gbps 0 alone: unlimited bandwidth.
struct LinkModel {
  std::string name = "none";
  double latency_us = 0;
  double gbps = 0;  // gigabits per second, as links are sold
};
// Presets: none, 1gbe, 10gbe, 25gbe, 100gbe-ib, pcie4, nvlink4, nvlink4-nccl, ndr400-x8 (the GPU's: NCCL's
// figures). A negative override keeps the preset's value.
// Throws std::invalid_argument naming the bad preset or value.
LinkModel parse_link(const std::string& preset, double latency_us_override = -1, double gbps_override = -1);
bool link_emulated(const LinkModel& link);  // anything but "none" without overrides

// A link model per class of hop (comm/link_emulation.h): between ranks of one node (intra), and across nodes
// (inter: the sending node's NIC, shared by its ranks). One model converts to "every hop" (--link X).
struct LinkClasses {
  LinkModel intra, inter;
  LinkClasses() = default;
  LinkClasses(const LinkModel& every_hop) : intra(every_hop), inter(every_hop) {}  // NOLINT: --link X is every hop
  bool per_class() const { return intra.name != inter.name || intra.latency_us != inter.latency_us ||
                                  intra.gbps != inter.gbps; }
  bool emulated() const { return link_emulated(intra) || link_emulated(inter); }
};

}  // namespace ddplab
