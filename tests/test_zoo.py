"""The tiny model zoo: every model reloads, its processor takes each medium it should, and it runs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText, AutoProcessor
from typer.testing import CliRunner

from quantkit.cli import app
from quantkit.errors import InputError
from quantkit.media import write_mp4
from quantkit.models.inputs import Sample, UnsupportedModality, processor_inputs
from quantkit.synthetic.media import write_wav
from quantkit.zoo.models import ZOO, build_zoo_model

ALL_MODELS = list(ZOO)


@pytest.fixture(scope="module")
def media(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("media")
    Image.new("RGB", (320, 240), (30, 120, 200)).save(root / "a.png")
    t = np.arange(16000 * 2) / 16000
    write_wav(root / "a.wav", 0.3 * np.sin(2 * np.pi * 220 * t))
    frames = [np.full((64, 96, 3), 20 * i, np.uint8) for i in range(8)]
    write_mp4(root / "v.mp4", iter(frames), (96, 64), 4)
    write_mp4(
        root / "va.mp4",
        iter(frames),
        (96, 64),
        4,
        audio=(0.3 * np.sin(2 * np.pi * 330 * t)).astype(np.float32),
    )
    return {
        "image": root / "a.png",
        "audio": root / "a.wav",
        "video": root / "v.mp4",
        "video+audio": root / "va.mp4",
    }


def samples(media: dict[str, Path]) -> dict[str, Sample]:
    def chat(prompt: str) -> list[dict]:
        return [{"role": "user", "content": prompt}, {"role": "assistant", "content": "An answer."}]

    return {
        "text": Sample(chat("Hello there.")),
        "image": Sample(chat("<image>Describe."), images=[media["image"]]),
        "video": Sample(chat("<video>When?"), videos=[media["video"]]),
        "video+audio": Sample(chat("<video>What is said?"), videos=[media["video+audio"]]),
        "audio": Sample(chat("<audio>Transcribe."), audios=[media["audio"]]),
    }


def load(path: Path, name: str):
    loader = AutoModelForCausalLM if not ZOO[name].modalities else AutoModelForImageTextToText
    return loader.from_pretrained(path).eval(), AutoProcessor.from_pretrained(path)


@pytest.mark.parametrize("name", ALL_MODELS)
def test_model_reloads_and_runs_on_each_medium(name, zoo_model, media):
    model, processor = load(zoo_model(name), name)
    assert type(model).__name__ == ZOO[name].architecture
    assert next(model.parameters()).dtype == torch.bfloat16
    supported = {"text", *ZOO[name].modalities}
    if "video" in supported and "audio" in supported:
        supported.add("video+audio")
    for medium, sample in samples(media).items():
        needs = set(medium.split("+"))
        if medium == "video+audio" and "audio" not in ZOO[name].modalities:
            needs = {"video"}  # a VL model watches the video and ignores its sound
        if not needs <= supported:
            with pytest.raises(UnsupportedModality):
                processor_inputs(processor, sample)
            continue
        inputs = processor_inputs(processor, sample)
        if medium == "image":
            assert "pixel_values" in inputs
        if medium.startswith("video"):
            assert "pixel_values_videos" in inputs
        if medium == "audio" or (medium == "video+audio" and "audio" in ZOO[name].modalities):
            assert "input_features" in inputs
        with torch.no_grad():
            logits = model(**inputs).logits
        assert logits.shape[:2] == inputs["input_ids"].shape
        assert torch.isfinite(logits).all(), f"{name} on {medium}"


@pytest.mark.parametrize("name", ALL_MODELS)
def test_language_model_linears_fit_group_128(name, zoo_model):
    config = AutoConfig.from_pretrained(zoo_model(name))
    with torch.device("meta"):
        model = (
            AutoModelForCausalLM if not ZOO[name].modalities else AutoModelForImageTextToText
        ).from_config(config)
    layers = [(n, m) for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and ".layers." in n]
    language = [(n, m) for n, m in layers if "visual" not in n and "audio_tower" not in n]
    assert language, "no language-model Linear found"
    assert all(m.in_features % 128 == 0 for _, m in language), [n for n, m in language if m.in_features % 128]


def test_same_seed_same_bytes_other_seed_differs(tmp_path):
    a = build_zoo_model("tiny-qwen3-vl", tmp_path / "a", seed=7)
    b = build_zoo_model("tiny-qwen3-vl", tmp_path / "b", seed=7)
    c = build_zoo_model("tiny-qwen3-vl", tmp_path / "c", seed=8)
    for file in ("model.safetensors", "tokenizer.json", "config.json", "processor_config.json"):
        assert (a / file).read_bytes() == (b / file).read_bytes(), file
    assert (a / "model.safetensors").read_bytes() != (c / "model.safetensors").read_bytes()


def test_tokenizer_has_family_special_tokens_and_template(zoo_model):
    processor = AutoProcessor.from_pretrained(zoo_model("tiny-qwen2.5-omni"))
    tokenizer = processor.tokenizer
    for token in ("<|im_start|>", "<|im_end|>", "<|AUDIO|>", "<|IMAGE|>", "<|VIDEO|>", "<|audio_bos|>"):
        ids = tokenizer(token, add_special_tokens=False)["input_ids"]
        assert len(ids) == 1, token  # a special token is never split
    text = processor.apply_chat_template(
        [{"role": "user", "content": [{"type": "audio"}, {"type": "text", "text": "hi"}]}],
        add_generation_prompt=True,
        tokenize=False,
    )
    assert text.endswith(
        "<|im_start|>user\n<|audio_bos|><|AUDIO|><|audio_eos|>hi<|im_end|>\n<|im_start|>assistant\n"
    )


def test_unknown_zoo_model_and_existing_output(tmp_path):
    with pytest.raises(InputError, match="unknown zoo model"):
        build_zoo_model("tiny-gpt", tmp_path / "x")
    build_zoo_model("tiny-qwen3", tmp_path / "t")
    with pytest.raises(InputError, match="already exists"):
        build_zoo_model("tiny-qwen3", tmp_path / "t")


def test_cli_zoo_list_and_build(tmp_path):
    runner = CliRunner()
    listed = runner.invoke(app, ["zoo", "list"])
    assert listed.exit_code == 0
    for name in ZOO:
        assert name in listed.output
    built = runner.invoke(app, ["zoo", "build", "tiny-qwen3", "--output", str(tmp_path / "m")])
    assert built.exit_code == 0, built.output
    assert (tmp_path / "m" / "model.safetensors").is_file()
    bad = runner.invoke(app, ["zoo", "build", "nope", "--output", str(tmp_path / "n")])
    assert bad.exit_code == 2 and "unknown zoo model" in bad.output
