# device call 1 (carry .gpu/p1): libraries into /tmp/site (kept while the machine stays warm, 30 s
# after a call), GGUF part 1, a smoke run of the parallel experiment on tiny-omni-skills.
mkdir -p /tmp/site /tmp/gg && xz -dc -T8 .gpu/p1/site.tar.xz | tar -xf - -C /tmp/site && cp .gpu/p1/gg.aa /tmp/gg/ || exit 3
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 QUANTKIT_CACHE=/tmp/qkcache
nvidia-smi -L; python3 -c "import torch, transformers, llmcompressor; print(torch.__version__, transformers.__version__, llmcompressor.__version__, torch.cuda.is_available())"
python3 -m quantkit zoo build tiny-omni-skills --output /tmp/tiny > $OUT/tiny-zoo.log 2>&1 || exit 4
timeout 100 python3 bench/skills_experiment.py --model /tmp/tiny --work /tmp/tiny-exp --results $OUT/tiny-smoke.json \
  --recipes w4a16,fp8 --arms stratified,uniform --sizes 16 --seeds 0 --items 16 --pool-per-task 8 --workers 4 --threads 2 > $OUT/tiny-smoke.log 2>&1
echo "smoke rc=$?"; grep -v "^|" $OUT/tiny-smoke.log | grep "done\|scored\|built\|failed" | cut -c1-200
