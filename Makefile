# Two commands do all set-up on a fresh machine: `make bench` and `make test`.
# Both create .venv and install the project from requirements.lock (and build Horovod) when needed.

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
PY     := $(BIN)/python
# TORCH=locked (default): torch and torchvision at requirements.lock's versions. TORCH=system: keep the torch that
# $(PYTHON) already has (NGC container, module system, a build for an older driver). WHEELS=DIR: install from a
# folder of wheels, with no package registry (scripts/install.sh).
TORCH  ?= locked
WHEELS ?=

GPUS    ?= all
RESULTS ?= results/raw
REPORT  ?= results/report
ARGS    ?=
DATA    ?=
# DATA=/path/to/imagenet measures the real input pipeline (DIR/train/<class>/*.JPEG) with LOADER (torchvision or
# dali) instead of synthetic data; see bench/rank/loaders.
LOADER  ?= torchvision
DATA_ARGS := $(if $(DATA),--data imagenet --data-dir $(DATA) --loader $(LOADER))
# bench loader's flags (its image size and batch default to bench run's; pass the same ones as in ARGS)
LOADER_ARGS ?= $(if $(filter-out all,$(GPUS)),--gpus $(GPUS))

.PHONY: venv install horovod bench report test test-fast gpu-check gpu-evidence list clean regress baseline verify lock check-lock wheels mutation coverage

# Does nothing when .venv already matches requirements.lock and TORCH; fails with one line when the lock is stale.
# From a registry it installs with make lock's uv (UV_VERSION, in .tools/lock-venv; made here when missing), about
# twice as fast as pip; from WHEELS=DIR with pip.
venv:
	@UV_VERSION=$(UV_VERSION) UV_VENV=$(abspath $(LOCK_VENV)) scripts/install.sh $(VENV) $(PYTHON) $(TORCH) $(WHEELS)

# Refresh requirements.lock (on purpose, then commit it): uv resolves pyproject.toml's dependencies for every
# platform at once (--universal), keeping today's pins where they still fit; UPGRADE=1 moves everything to the
# newest versions. The first line records pyproject.toml's fingerprint, which `make check-lock` and every install
# compare.
UV_VERSION ?= 0.13.9
LOCK_VENV  := .tools/lock-venv
lock:
	@scripts/uv.sh $(LOCK_VENV) $(UV_VERSION) $(PYTHON) > /dev/null
	$(LOCK_VENV)/bin/uv pip compile pyproject.toml --extra dev --extra build --extra trace \
	  --excludes scripts/lock-excludes.txt --universal --fork-strategy fewest \
	  --generate-hashes --quiet $(if $(UPGRADE),--upgrade) -o requirements.lock
	@{ echo "# pyproject-fingerprint: $$($(PYTHON) scripts/lockfile.py fingerprint)"; grep -v '^# pyproject-fingerprint: ' requirements.lock; } > requirements.lock.tmp
	@mv requirements.lock.tmp requirements.lock
	@grep -E '^(torch|torchvision)==' requirements.lock

check-lock:
	@$(PYTHON) scripts/lockfile.py check && echo "requirements.lock matches pyproject.toml"

# Where pip works: download the locked files another machine will need into WHEELS (hash-checked), for its Python
# (WHEELS_PYTHON). Default: every locked package, Horovod's source archive included. HAVE=FILE, the other machine's
# `python3 -m pip list --format=freeze` (or a profile in scripts/machines/): only what TORCH=system there lacks, plus
# Horovod's source and its build requirements. WHEELS_HOROVOD=1: only Horovod's source and what it needs.
# WHEELS_ONLY: these packages by hand. There: make venv TORCH=system WHEELS=DIR ... ; make horovod WHEELS=DIR ...
WHEELS_PYTHON  ?=
WHEELS_ONLY    ?=
WHEELS_HOROVOD ?=
wheels:
	@[ -n "$(WHEELS)" ] || { echo "make wheels: say where, e.g. WHEELS=.whl" >&2; exit 2; }
	@scripts/install.sh $(VENV) $(PYTHON) $(TORCH)  # this venv, from the registry: WHEELS is where the files go
	$(PY) scripts/lockfile.py wheels -d $(WHEELS) $(if $(WHEELS_PYTHON),--python-version $(WHEELS_PYTHON)) \
	  $(if $(HAVE),--have $(HAVE)) $(if $(WHEELS_HOROVOD),--horovod) $(if $(WHEELS_ONLY),--only $(WHEELS_ONLY))

# Horovod is an sdist compiled against the installed torch; scripts/build_horovod.sh caches the wheel and
# does nothing when the build is already current. A failed build does not stop the rest of the suite:
# the horovod backend is then recorded as skipped with the reason (BENCH_REQUIRE_HOROVOD=1 makes it fatal).
horovod: venv
	@scripts/build_horovod.sh $(VENV) || { [ "$(BENCH_REQUIRE_HOROVOD)" != 1 ] && \
	  echo "make horovod: build failed; the horovod backend will be skipped (see $(VENV)/horovod-build.log)" >&2; }

install: venv horovod

# The default suite on synthetic data on every device found; GPUS=N sweeps 1, 2, 4, ... up to N.
# Every run also measures its compute-only reference (exposed communication); a short collectives sweep gives
# the bus bandwidth the report and `bench predict` use; `bench overhead` each backend's host cost per step.
# With DATA, the same sweep also runs on synthetic data (the model alone) and `bench loader` measures every
# loader's ceiling (no model), so the report's "Input bound" section can compare the three.
COLLECTIVES_ARGS ?=
# Each configuration's plain twin (bench/twins, docs/close-to-the-machine.md) runs beside it: the report's harness
# overhead; REFERENCE= leaves it out.
REFERENCE ?= --reference
# QUICK=1: the first look (bench run --quick: one repetition of single, ddp and fsdp2), without the twins, the
# collectives sweep and the host-cost rounds: 5 minutes on an 8-GPU node by bench run's estimate. Its verdict names no
# winner (one run each).
QUICK ?=
RUN_EXTRA := $(if $(QUICK),--quick,$(REFERENCE))
# The world sizes: GPUS, unless ARGS names them (--gpus 1,2,4,8: every size)
SIZES = $(if $(findstring --gpus,$(ARGS)),,--max-gpus $(GPUS))
# Each step's command is printed, then run (not the shell block that strings them together). With one device in the
# sweep there is no collective to measure (bench collectives would refuse it: exit 2, nothing to run), so it is left out.
# bench run's exit 2 (bad input, or GPUs torch cannot use: nothing ran) ends make bench there, with its one line.
export SEVERAL_DEVICES := import sys; from bench.core.devices import several_devices; sys.exit(not several_devices())
bench: install
	@status=0; \
	echo '$(strip $(PY) -m bench run $(SIZES) --results $(RESULTS) $(RUN_EXTRA) $(DATA_ARGS) $(ARGS))'; \
	$(PY) -m bench run $(SIZES) --results $(RESULTS) $(RUN_EXTRA) $(DATA_ARGS) $(ARGS) || status=$$?; \
	[ $$status -ne 2 ] || exit 2; \
	if [ -n "$(DATA)" ]; then \
	  echo '$(strip $(PY) -m bench run $(SIZES) --results $(RESULTS) $(RUN_EXTRA) $(ARGS))'; \
	  $(PY) -m bench run $(SIZES) --results $(RESULTS) $(RUN_EXTRA) $(ARGS) || status=1; \
	  echo '$(strip $(PY) -m bench loader --data-dir $(DATA) --results $(RESULTS) $(LOADER_ARGS))'; \
	  $(PY) -m bench loader --data-dir $(DATA) --results $(RESULTS) $(LOADER_ARGS) || status=1; \
	fi; \
	if [ -n "$(QUICK)" ]; then echo "make bench QUICK=1: no collectives sweep, no host-cost rounds"; \
	elif [ "$(GPUS)" != 1 ] && $(PY) -c "$$SEVERAL_DEVICES"; then \
	  echo '$(strip $(PY) -m bench collectives --max-gpus $(GPUS) --results $(RESULTS) $(COLLECTIVES_ARGS))'; \
	  $(PY) -m bench collectives --max-gpus $(GPUS) --results $(RESULTS) $(COLLECTIVES_ARGS) || status=1; \
	else echo "make bench: one device in the sweep: no collectives to measure"; fi; \
	if [ -z "$(QUICK)" ]; then \
	  echo '$(PY) -m bench overhead --results $(RESULTS)'; \
	  $(PY) -m bench overhead --results $(RESULTS) || status=1; \
	fi; \
	echo '$(PY) -m bench report --results $(RESULTS) --out $(REPORT)'; \
	$(PY) -m bench report --results $(RESULTS) --out $(REPORT) || status=1; exit $$status

# Training equivalence (docs/verifying.md): every backend trains K steps on the same data and
# is compared with a single-process reference; exit 1 when one trains something else.
verify: install
	$(PY) -m bench verify --max-gpus $(GPUS) --results $(RESULTS) $(ARGS)

report: venv
	$(PY) -m bench report --results $(RESULTS) --out $(REPORT)

list: venv
	$(PY) -m bench list

# Tests run in TEST_JOBS processes (pytest-xdist; default: the cores this job may use), each test module on one
# process (--dist loadscope: its module fixtures run once); a `gpu` test holds a lock while it runs (tests/conftest.py),
# so one GPU is never shared by two tests. `make test` prints the 15 slowest items (set-up included).
# TEST_JOBS=1 runs them in this process. BENCH_TEST_CALIBRATE=1: the run first times a fresh `import torch` and prints
# it with where the CPU went (tests/cpu_time.py). pytest exits 5 when it collected no tests: a suite that tests nothing
# is a failure, said plainly.
TEST_JOBS ?= $(shell nproc 2>/dev/null || echo 1)
XDIST     := $(if $(filter-out 0 1,$(TEST_JOBS)),-n $(TEST_JOBS) --dist loadscope)
test: install
	@echo '$(strip BENCH_TEST_CALIBRATE=1 $(PY) -m pytest -q -rs --durations=15 $(XDIST) tests $(ARGS))'; \
	BENCH_TEST_CALIBRATE=1 $(PY) -m pytest -q -rs --durations=15 $(XDIST) tests $(ARGS); status=$$?; \
	if [ $$status -eq 5 ]; then echo "make test: pytest collected no tests" >&2; fi; exit $$status

# The inner loop: the tests that launch no run, start no process group and train nothing (tests/conftest.py refuses
# all three under BENCH_TEST_FAST=1, so a test that needs `@pytest.mark.slow` fails here instead of slowing it down).
test-fast: venv
	@echo '$(strip BENCH_TEST_FAST=1 $(PY) -m pytest -q -rs $(XDIST) -m "not slow and not gpu" tests $(ARGS))'; \
	BENCH_TEST_FAST=1 $(PY) -m pytest -q -rs $(XDIST) -m "not slow and not gpu" tests $(ARGS); status=$$?; \
	if [ $$status -eq 5 ]; then echo "make test-fast: pytest collected no tests" >&2; fi; exit $$status

# The CPU suite under coverage (not part of make test: about twice its time), every process it starts measured (pyproject's
# [tool.coverage.run]); then the lines of bench/ and backends/ that only a GPU executes (scripts/gpu_only_lines.py:
# the device seam's library calls, and any project logic no CPU test reaches through the fake GPU machine), listed.
# Data and the HTML report in results/coverage/. COVERAGE_TESTS=tests/test_x.py narrows it; ARGS passes pytest flags.
COVERAGE_DIR := $(abspath results/coverage)
COVERAGE_TESTS ?= tests
coverage: install
	@rm -rf $(COVERAGE_DIR); mkdir -p $(COVERAGE_DIR); \
	echo '$(strip COVERAGE_FILE=$(COVERAGE_DIR)/.coverage $(PY) -m coverage run -m pytest -q -p no:cacheprovider $(XDIST) $(COVERAGE_TESTS) $(ARGS))'; \
	COVERAGE_FILE=$(COVERAGE_DIR)/.coverage $(PY) -m coverage run -m pytest -q -p no:cacheprovider $(XDIST) $(COVERAGE_TESTS) $(ARGS); \
	status=$$?; \
	COVERAGE_FILE=$(COVERAGE_DIR)/.coverage $(PY) -m coverage combine -q $(COVERAGE_DIR) && \
	COVERAGE_FILE=$(COVERAGE_DIR)/.coverage $(PY) -m coverage html -q -d $(COVERAGE_DIR)/html && \
	$(PY) scripts/gpu_only_lines.py --data $(COVERAGE_DIR)/.coverage --list --json $(COVERAGE_DIR)/gpu-only.json || status=1; \
	echo "make coverage: pytest exited $$status; report: $(COVERAGE_DIR)/html/index.html, $(COVERAGE_DIR)/gpu-only.json"; \
	exit $$status

# One command that proves a GPU machine (docs/gpu-machine.md): the launch plan (every backend at bf16 and fp16, fp32
# through bench verify, 2 ranks, the single-purpose runs; several launches at once), the gpu tests on its records, one
# table and the verdict, in 420 s (with `make venv`, 8 minutes on one GPU). It builds no Horovod (minutes of compiling:
# its row says "not built" unless a build is already there). FULL=1, 600 s: Horovod (with NCCL) compiled beside the
# plan's first launches where it is not built (its launches wait for it; BUILD_JOBS, WHEELS pass through), the measured
# sweep of the default backends and Horovod, and the make baseline command for this GPU; the estimate is printed first.
# Offline: add TORCH=system WHEELS=DIR.
FULL ?=
gpu-check: venv
	$(PY) -m bench doctor $(if $(FULL),--full) $(ARGS)

# The GPU evidence (docs/gpu-machine.md, "GPU evidence in one script"): on a lent GPU machine, in order of value and
# inside EVIDENCE_BUDGET seconds, Horovod's rows of gpu-check FULL=1, bench tune --preset gpu-best, FSDP2's ResNet-50
# parity and make baseline GPUS=1, each step under its own timeout, everything under OUT; FROM=STEP goes on from a step
# the budget did not reach, STEPS=a,b runs those; PACK=DIR gets evidence.md and evidence.tgz at the end (the device
# tool's $OUT returns 8 files, 2 folders deep). Offline: add TORCH=system WHEELS=DIR PYTHON=python3.
EVIDENCE_BUDGET ?= 480
gpu-evidence: venv
	@[ -n "$(OUT)" ] || { echo "make gpu-evidence: say where, e.g. OUT=results/evidence" >&2; exit 2; }
	PY=$(PY) PACK=$(PACK) scripts/gpu_evidence.sh $(OUT) $(EVIDENCE_BUDGET)

# Regression gate (docs/regression-gate.md). A fixed, short configuration on every device, compared with
# results/baselines/<GPU model>-x<N>.json (`bench baseline name` prints the name for this machine) or BASELINE=NAME.
# Exit status: the gate's when it fails (1: slower or more memory; 2: bad input, e.g. no baseline for this
# GPU; 3: inconclusive, runs disturbed by other processes or GPU throttling), else bench run's (1 when a run failed).
# Inconclusive runs the benchmark and the gate again, up to REGRESS_RETRIES times, each run first waiting up to
# REGRESS_WAIT_QUIET s for a quiet machine (bench run --wait-quiet-s); still inconclusive, the status is 3. GNU make
# itself exits 2 whenever a recipe fails, so the status is also written to $(REPORT)/regress.exit for CI to read.
# Change REGRESS_ARGS only together with the baselines.
# The run is the statistical unit: 3 interleaved runs of every configuration a side, 5 windows each.
REGRESS_RESULTS    ?= results/regress
BASELINE           ?=
REGRESS_ARGS       ?= --model default --backends single,dp,ddp,ddp_spawn,ddp_amp_syncbn --repeat 3 --warmup 10 --steps 10 --windows 5
REGRESS_RETRIES    ?= 1
REGRESS_WAIT_QUIET ?= 60

regress: install
	@name='$(BASELINE)'; [ -n "$$name" ] || name=$$($(PY) -m bench baseline name --max-gpus $(GPUS)) || exit 2; \
	base=results/baselines/$$name.json; \
	if [ ! -f "$$base" ]; then \
	  echo "make regress: no baseline $$base; record one on this machine with: make baseline" >&2; exit 2; fi; \
	mkdir -p $(REPORT); attempt=0; quiet=; \
	while :; do \
	  rm -rf $(REGRESS_RESULTS); \
	  $(PY) -m bench run --max-gpus $(GPUS) --results $(REGRESS_RESULTS) $(REGRESS_ARGS) $$quiet; status=$$?; \
	  $(PY) -m bench compare "$$base" $(REGRESS_RESULTS) --out $(REPORT)/regress.md; gate=$$?; \
	  if [ $$gate -ne 0 ]; then status=$$gate; fi; \
	  if [ $$gate -ne 3 ] || [ $$attempt -ge $(REGRESS_RETRIES) ]; then break; fi; \
	  attempt=$$((attempt + 1)); quiet="--wait-quiet-s $(REGRESS_WAIT_QUIET)"; \
	  echo "make regress: inconclusive (disturbed runs); running again ($$attempt of $(REGRESS_RETRIES)), each run" \
	    "waiting up to $(REGRESS_WAIT_QUIET) s for a quiet machine" >&2; \
	done; echo $$status > $(REPORT)/regress.exit; exit $$status

# Record (or, with FORCE=1, replace) the baseline for this machine's GPU model and count from a fresh run of the same
# configuration, each run first waiting up to REGRESS_WAIT_QUIET s for a quiet machine. `bench baseline save` refuses
# a failed run (exit 1) or disturbed ones (exit 3: every later gate against them would be inconclusive) unless
# ACCEPT_DISTURBED=1. Review the numbers, then commit results/baselines/<name>.json.
ACCEPT_DISTURBED ?=
baseline: install
	rm -rf $(REGRESS_RESULTS)
	$(PY) -m bench run --max-gpus $(GPUS) --results $(REGRESS_RESULTS) $(REGRESS_ARGS) --wait-quiet-s $(REGRESS_WAIT_QUIET)
	$(PY) -m bench baseline save --from $(REGRESS_RESULTS) $(if $(BASELINE),--name $(BASELINE)) $(if $(FORCE),--force) \
	  $(if $(ACCEPT_DISTURBED),--accept-disturbed)

# Mutation testing (docs/tests.md, "Mutation testing"), not part of `make test`: mutmut (pinned, in its own tool venv that
# reads .venv's packages through a .pth) mutates the functions in MUTANTS, in the files pyproject.toml's [tool.mutmut]
# names, and runs the tests marked `mutation` (tests/README.md) against each mutant; then one line per module: killed,
# survived, no tests, timeout, score. Every run starts afresh (mutmut re-tests only mutants whose function changed,
# not after a test changed). MUTANTS="bench.core.stats.*" narrows it; the log is mutants/run.log.
# OMP_NUM_THREADS=1: two workers on two cores, and no OpenMP pool for forked workers to inherit.
MUTMUT_VERSION ?= 3.8.1
MUTMUT_VENV    := .tools/mutmut-venv
MUTATION_JOBS  ?= $(shell nproc 2>/dev/null || echo 2)
MUTANTS ?= 'backends.allreduce_manual.*' 'backends.dp.x?AutocastForward?forward__*' \
  'backends.dp.x?DataParallel?setup__*' 'backends.ddp.x_register_comm_hook__*' 'backends.ddp.x?DDP?setup__*' \
  'backends.fsdp2.x_shard__*' 'backends.fsdp2.x_norm_groups__*' 'backends.fsdp2.x?FSDP2?step__*' \
  'backends.deepspeed_zero.x?DeepSpeedZero?setup__*' 'backends.deepspeed_zero.x?DeepSpeedZero?loss_scale__*' \
  'backends.deepspeed_zero.x?DeepSpeedZero?skipped_steps__*' \
  'bench.rank.data.x_verify_batches__*' 'bench.rank.data.x_loader_workers__*' 'bench.rank.data.x_default_workers__*' \
  'bench.rank.data.x_shard_rank__*' 'bench.rank.data.x_batches_for__*' 'bench.rank.data.x_synthetic__*' \
  'bench.rank.data.x?TimedBatches?*' 'bench.rank.data.x?_DataLoaderSource?epoch__*' \
  'bench.rank.loaders.tv.x_data_loader__*' 'bench.rank.loaders.tv.x?TorchvisionSource?*' \
  'bench.rank.loaders.tv.x?SkippingImageFolder?__getitem__*' \
  'bench.rank.train.x_windows__*' 'bench.rank.train.x_skips__*' 'bench.rank.train.x_compute_only_reason__*' \
  'bench.rank.record.*' 'bench.core.stats.*' \
  'bench.commands.compare.x_compare__*' 'bench.commands.compare.x__compare_one__*' \
  'bench.commands.compare.x_cmd_compare__*' 'bench.commands.compare.x__side_summary__*' \
  'bench.commands.compare.x__match_key__*' 'bench.commands.compare.x__median__*' \
  'bench.commands.compare.x_peak_device_memory__*' 'bench.commands.compare.x_peak_host_rss__*' \
  'bench.commands.compare.x__fraction__*' 'bench.commands.compare.x_check_hardware__*' \
  'bench.commands.compare.x__row__*' 'bench.commands.compare.x__one_sided__*'
mutation: venv
	@[ -f $(MUTMUT_VENV)/.mutmut-$(MUTMUT_VERSION) ] || { rm -rf $(MUTMUT_VENV) && $(PY) -m venv $(MUTMUT_VENV) && \
	  $(PY) -c "import sys; print('\n'.join(p for p in sys.path if p.endswith('-packages')))" \
	    > "$$($(MUTMUT_VENV)/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")/_bench_venv.pth" && \
	  $(MUTMUT_VENV)/bin/python -m pip install -q --disable-pip-version-check mutmut==$(MUTMUT_VERSION) && \
	  touch $(MUTMUT_VENV)/.mutmut-$(MUTMUT_VERSION); }
	rm -rf mutants; mkdir mutants
	@start=$$(date +%s); OMP_NUM_THREADS=1 $(MUTMUT_VENV)/bin/mutmut run --max-children $(MUTATION_JOBS) $(MUTANTS) \
	  > mutants/run.log 2>&1; status=$$?; \
	echo "make mutation: mutmut run exited $$status after $$(( $$(date +%s) - start )) s (log: mutants/run.log)"; \
	$(PY) scripts/mutation_score.py $(MUTANTS) || status=1; exit $$status

clean:
	rm -rf results/raw results/report results/regress
