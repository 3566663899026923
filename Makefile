# The front door. CMake is the build; these are the commands people type.
#   make demo    install what is missing, build, run the DDP lab suite on 4 ranks (mpirun -np 4 ddplab suite lab),
#                on the GPU when this build sees one (DEVICE=cpu|cuda overrides; SUITE_FLAGS=--full adds flags)
#   make test    install what is missing, build, run every test (ctest)
#   make bench   five of the CPU benchmarks in docs/BENCHMARKS.md (bench/run_all.sh says which)
BUILD ?= build
NP ?= 4
# auto: cuda when a GPU is usable (our ring over CUDA IPC lets the NP ranks share one), else cpu
DEVICE ?= auto
CMAKE_FLAGS ?=
JOBS ?= $(shell nproc)
# extra flags for the demo's `ddplab suite lab` (e.g. --full)
SUITE_FLAGS ?=

.PHONY: all deps configure build demo test bench clean

all: build

deps:
	@scripts/install_deps.sh

$(BUILD)/CMakeCache.txt: | deps
	cmake -S . -B $(BUILD) $(CMAKE_FLAGS)

configure: deps $(BUILD)/CMakeCache.txt

build: configure
	cmake --build $(BUILD) -j $(JOBS)

demo: build
	@dev=$(DEVICE); \
	if [ "$$dev" = auto ]; then \
	  dev=cpu; \
	  $(BUILD)/launcher/ddplab devices | grep 'CUDA  built:' | grep -vq 'no CUDA device' && dev=cuda; \
	fi; \
	echo "make demo: the lab on --device $$dev"; \
	scripts/mpirun.sh -np $(NP) $(BUILD)/launcher/ddplab suite lab --device $$dev $(SUITE_FLAGS)

test: build
	cd $(BUILD) && ctest --output-on-failure -j 1

bench: build
	bench/run_all.sh $(BUILD)

clean:
	rm -rf $(BUILD)
