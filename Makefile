# The front door. CMake is the build; these are the commands people type.
#   make demo    install what is missing, build, run the DDP lab suite on 4 ranks (mpirun -np 4 ddplab suite lab)
#   make test    install what is missing, build, run every test (ctest)
#   make bench   the benchmarks recorded in docs/BENCHMARKS.md
BUILD ?= build
NP ?= 4
CMAKE_FLAGS ?=
JOBS ?= $(shell nproc)

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
	scripts/mpirun.sh -np $(NP) $(BUILD)/launcher/ddplab suite lab

test: build
	cd $(BUILD) && ctest --output-on-failure -j 1

bench: build
	bench/run_all.sh $(BUILD)

clean:
	rm -rf $(BUILD)
