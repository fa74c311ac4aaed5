# Thin wrapper over CMake. `make run` and `make test` do their own set-up (scripts/setup.sh).
BUILD      ?= build
JOBS       ?= $(shell nproc)
CMAKE_ARGS ?=

.PHONY: all setup build run lint lint-paths test test-main test-asan test-tsan coverage python-install-test clean

all: build

setup:
	@bash scripts/setup.sh

build: setup
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMETRALE_CUTLASS_BLACKWELL=ON $(CMAKE_ARGS) >/dev/null
	cmake --build $(BUILD) -j $(JOBS)

# The main job: what is here, then a real model answering a question on the best backend
# present: SmolLM2-135M-Instruct (fetched by version and sha256 into .models/, once).
# `metrale-gpu run --preset NAME` keeps the synthetic models for benchmarks.
QUESTION ?= What is the capital of France?
run: build
	./$(BUILD)/metrale-gpu info
	./$(BUILD)/metrale-gpu run --model "$$(bash scripts/fetch_smollm2.sh)" --chat "$(QUESTION)"

# Every test: the lint, the normal build, then ASan+UBSan, then ThreadSanitizer on the
# concurrent parts.
test: lint test-main test-asan test-tsan

# scripts/lint.sh: every C, C++ and CUDA file clean against .clang-format (clang-format 14) and
# every path the tree names existing; `lint-paths` runs the second check alone.
lint: setup
	bash scripts/lint.sh
lint-paths:
	bash scripts/lint.sh --paths

test-main: build
	ctest --test-dir $(BUILD) --output-on-failure -j $(JOBS)

# Sanitizer builds skip nvcc (the kernels are device code the sanitizers cannot see) but
# keep the CUDA host code, which runs its no-driver paths here.
test-asan: setup
	cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DMETRALE_SANITIZE=address,undefined \
	      -DMETRALE_CUDA_KERNELS=OFF $(CMAKE_ARGS) >/dev/null
	cmake --build build-asan -j $(JOBS)
	ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
	    ctest --test-dir build-asan --output-on-failure -j $(JOBS)

test-tsan: setup
	cmake -S . -B build-tsan -DCMAKE_BUILD_TYPE=Debug -DMETRALE_SANITIZE=thread \
	      -DMETRALE_CUDA_KERNELS=OFF $(CMAKE_ARGS) >/dev/null
	cmake --build build-tsan -j $(JOBS)
	TSAN_OPTIONS=halt_on_error=1 ctest --test-dir build-tsan --output-on-failure -L concurrency

# Line and branch coverage of src/ (without cuda/) over the whole suite, CPU build; the table
# is also written to build-coverage/ with an HTML report (scripts/coverage.sh).
coverage:
	JOBS=$(JOBS) bash scripts/coverage.sh

# `pip install .` into a fresh virtual environment, then import and one op outside the tree
# (scripts/python_install_test.sh; PIP_ARGS passes pip options, e.g. a CPU-only build:
# PIP_ARGS=--config-settings=cmake.define.METRALE_CUDA=OFF).
python-install-test: setup
	bash scripts/python_install_test.sh $(PIP_ARGS)

clean:
	rm -rf $(BUILD) build-asan build-tsan build-coverage build-wheel build-python-install
