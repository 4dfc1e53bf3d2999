# kvpool: every target installs missing dependencies and builds first.
SHELL := /bin/bash
BUILD_DIR ?= build
BUILD_TYPE ?= RelWithDebInfo
FUZZ_SECONDS ?= 60
TEST_FUZZ_SECONDS ?= 30
ARGS ?=

.PHONY: all deps configure build run test test-deploy package bench fuzz format clean

all: build

deps:
	@bash scripts/install-deps.sh

configure: deps
	@cmake -S . -B $(BUILD_DIR) -G Ninja -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) >/dev/null

build: configure
	@ninja -C $(BUILD_DIR)

# A standalone node with embedded defaults (Ctrl-C stops it).
run: build
	@echo "kvpool-node: socket /run/kvpool/kvpool.sock (else \$$XDG_RUNTIME_DIR/kvpool/ or /tmp/kvpool-$$(id -u)/; the node logs which), dashboard http://127.0.0.1:9710/"
	@echo "  try: $(BUILD_DIR)/tools/kvpoolctl put demo greeting --value hello"
	@echo "       $(BUILD_DIR)/tools/kvpoolctl get demo greeting"
	@echo "       $(BUILD_DIR)/tools/kvpoolctl stat"
	@exec $(BUILD_DIR)/src/node/kvpool-node $(ARGS)

# Every test: a bounded fuzz pass over the decoders, then the ctest suite
# (unit and integration tests against the real binaries).
test: build
	@$(MAKE) --no-print-directory fuzz FUZZ_SECONDS=$(TEST_FUZZ_SECONDS)
	@cd $(BUILD_DIR) && ctest --output-on-failure --timeout 600 -j2

# Debian packages of this build into $(BUILD_DIR)/packages, then the same
# checks as the package test (lintian, an install into a temporary root, the
# service unit started as systemd would).
package: build
	@bash tests/package/package_test.sh $(BUILD_DIR) $(BUILD_DIR)/packages

# Deploying as the README says (tests/deploy/deploy_test.sh, also ctest
# deploy_test): make package, then apt-get install -y ./$(BUILD_DIR)/packages/*.deb
# in a private mount namespace over overlays (the host is left unchanged),
# and a two-host cluster in network namespaces run from the installed
# packages as their unit starts the node. Needs root; make package inside
# it installs deps and builds.
test-deploy:
	@bash tests/deploy/deploy_test.sh $(BUILD_DIR)

bench: build
	@bash bench/compare.sh local

# libFuzzer + ASan/UBSan over the codec's decoders, bounded in time.
fuzz: deps
	@cmake -S . -B build-fuzz -G Ninja -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
	  -DKVPOOL_FUZZ=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
	@ninja -C build-fuzz codec_fuzz
	@mkdir -p build-fuzz/corpus
	@build-fuzz/src/protocol/codec_fuzz -max_total_time=$(FUZZ_SECONDS) -timeout=5 \
	  -rss_limit_mb=2560 -print_final_stats=1 build-fuzz/corpus src/protocol/fuzz_corpus \
	  2>&1 | grep -E '^(stat::|Done|==|SUMMARY)' ; test $${PIPESTATUS[0]} -eq 0

format:
	@clang-format -i $$(git ls-files '*.h' '*.cc')

clean:
	rm -rf $(BUILD_DIR) build-fuzz
