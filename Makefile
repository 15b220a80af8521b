# The README's commands. Each one installs what is missing, configures and
# builds by itself, so it works on a fresh Debian machine.
BUILD ?= build
SAN_BUILD ?= build-sanitize
TSAN_BUILD ?= build-tsan
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
CMAKE_FLAGS ?=

FUZZ_BUILD ?= build-fuzz
FUZZ_SECONDS ?= 60

.PHONY: all deps build demo test test-sanitize test-tsan fuzz bench bench-check bench-baseline clean

all: build

deps:
	@scripts/install-deps

build: deps
	@cmake -S . -B $(BUILD) $(CMAKE_FLAGS) >$(BUILD).configure.log 2>&1 || \
	  { cat $(BUILD).configure.log; exit 1; }
	@cmake --build $(BUILD) -j $(JOBS)

demo: build
	$(BUILD)/pipeshard demo

test: build
	ctest --test-dir $(BUILD) --output-on-failure -j $(JOBS)

test-sanitize: deps
	@cmake -S . -B $(SAN_BUILD) -DPS_SANITIZE=ON -DCMAKE_BUILD_TYPE=Debug $(CMAKE_FLAGS) \
	  >$(SAN_BUILD).configure.log 2>&1 || { cat $(SAN_BUILD).configure.log; exit 1; }
	@cmake --build $(SAN_BUILD) -j $(JOBS)
	ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
	  ctest --test-dir $(SAN_BUILD) --output-on-failure -j $(JOBS)
	@$(MAKE) --no-print-directory test-tsan

# The tests whose devices are threads (ctest label `threads`) under
# ThreadSanitizer, without the simulator and CUDA (SimGrid switches its own
# contexts, which ThreadSanitizer cannot follow). tests/tsan.supp: races
# inside Open MPI, which is not instrumented.
test-tsan: deps
	@cmake -S . -B $(TSAN_BUILD) -DPS_TSAN=ON -DPS_WITH_SIMGRID=OFF -DPS_WITH_CUDA=OFF \
	  -DCMAKE_BUILD_TYPE=RelWithDebInfo $(CMAKE_FLAGS) \
	  >$(TSAN_BUILD).configure.log 2>&1 || { cat $(TSAN_BUILD).configure.log; exit 1; }
	@cmake --build $(TSAN_BUILD) -j $(JOBS)
	TSAN_OPTIONS=suppressions=$(CURDIR)/tests/tsan.supp:halt_on_error=1:exitcode=66:second_deadlock_stack=1 \
	  ctest --test-dir $(TSAN_BUILD) --output-on-failure -j $(JOBS) -L threads

# Fuzzing (FUZZ_SECONDS per target, 10 targets): every parser of the project's
# files and command-line texts, under libFuzzer with ASan and UBSan (clang),
# without the simulator or CUDA. New failing inputs land in
# $(FUZZ_BUILD)/fuzz-crashes/; see docs/fuzzing.md.
fuzz:
	@scripts/install-deps --fuzz
	@CC=clang cmake -S . -B $(FUZZ_BUILD) -DPS_FUZZ=ON -DPS_WITH_SIMGRID=OFF -DPS_WITH_CUDA=OFF \
	  -DPS_WITH_MPI=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo $(CMAKE_FLAGS) \
	  >$(FUZZ_BUILD).configure.log 2>&1 || { cat $(FUZZ_BUILD).configure.log; exit 1; }
	@cmake --build $(FUZZ_BUILD) -j $(JOBS) --target fuzzers
	scripts/fuzz $(FUZZ_BUILD) $(FUZZ_SECONDS)

# Benchmarks (long): ILP sizes and times, planning times and predicted throughput
# for the GPT, MoE and Wide-ResNet suites (and the scaling chart's CSV), simulator
# speed on GPT-3 175B at 1024, 4096 and 16384 devices, the automatic plan against the best
# uniform, data and ZeRO plans on the simulator. See docs/bench.md.
bench: build
	$(BUILD)/bench_intra --csv $(BUILD)/bench_intra.csv
	$(BUILD)/bench_plan --csv $(BUILD)/bench_plan.csv --scaling $(BUILD)/bench_scaling.csv
	$(BUILD)/pipeshard plot --scaling $(BUILD)/bench_scaling.csv -o $(BUILD)/bench-charts
	$(BUILD)/bench_methods --csv $(BUILD)/bench_methods.csv
	$(BUILD)/bench_sim --devices 1024,4096 --node-collectives flows,closed-form,transfers --csv $(BUILD)/bench_sim.csv
	$(BUILD)/bench_sim --devices 16384 --csv $(BUILD)/bench_sim_16384.csv
	$(BUILD)/bench_check --csv $(BUILD)/bench_check.csv

# The regression check (about half a minute): a quick subset of the benchmarks run
# fresh and compared with bench/baselines/bench_check.csv: plan quality within 1%,
# timings (as ratios to a calibration loop run alongside) within 1.5x. See docs/bench.md.
bench-check: build
	$(BUILD)/bench_check --baseline bench/baselines/bench_check.csv --csv $(BUILD)/bench_check.csv

# Rewrites the stored baseline from a fresh run on this machine (commit the result).
bench-baseline: build
	$(BUILD)/bench_check --csv bench/baselines/bench_check.csv

clean:
	rm -rf $(BUILD) $(SAN_BUILD) $(FUZZ_BUILD) $(BUILD).configure.log $(SAN_BUILD).configure.log \
	  $(FUZZ_BUILD).configure.log
