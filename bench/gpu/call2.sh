# device call 2 (carry .gpu/p2), within 30 s of call 1: GGUF part 2
cp .gpu/p2/gg.ab /tmp/gg/ && ls -la /tmp/gg
