"""The model card is Hub-ready: its YAML front matter parses with huggingface_hub's ModelCard and
carries base model, relation, library, tags and pipeline; later eval sections keep it intact."""

from __future__ import annotations

import pytest
from huggingface_hub import ModelCard

from quantkit.eval.report import SECTION_END, SECTION_START, update_card
from quantkit.export.card import base_model_id, front_matter
from quantkit.quantize import quantize
from quantkit.recipes import SCHEME_FORMATS, get_recipe
from quantkit.recipes.schemes import SCHEMES

pytestmark = pytest.mark.filterwarnings("ignore:Attempting to save a model with offloaded modules")


@pytest.fixture(scope="module")
def exported(zoo_model, tmp_path_factory):
    """A real checkpoint of the tiny Qwen3-VL, data-free FP8 (no calibration run needed)."""
    source = zoo_model("tiny-qwen3-vl")
    output = tmp_path_factory.mktemp("card") / "vl-fp8-dynamic"
    quantize(source, output, get_recipe("fp8-dynamic"), [], progress=False)
    return source, output


def test_exported_card_front_matter_parses_on_the_hub_schema(exported):
    source, output = exported
    text = (output / "README.md").read_text(encoding="utf-8")
    assert text.startswith("---\n")
    card = ModelCard.load(output / "README.md")
    data = card.data.to_dict()
    assert data["base_model"] == source.name  # a local folder: its name, and the card says so
    assert data["base_model_relation"] == "quantized"
    assert data["library_name"] == "transformers"
    assert data["pipeline_tag"] == "image-text-to-text"
    assert {"compressed-tensors", "fp8_dynamic", "fp8-dynamic", "quantkit"} <= set(data["tags"])
    assert "set `base_model` above to its Hub id" in card.text
    assert card.text.lstrip().startswith(f"# {output.name}")
    assert SCHEMES["FP8_DYNAMIC"].card_serving in card.text


def test_eval_section_keeps_the_front_matter(exported):
    _, output = exported
    before = ModelCard.load(output / "README.md").data.to_dict()
    for run in ("first", "second"):  # appended, then replaced
        update_card(output, f"{SECTION_START}\n## Evaluation\n\n{run} run\n{SECTION_END}\n")
    card = ModelCard.load(output / "README.md")
    assert card.data.to_dict() == before
    assert "second run" in card.text and "first run" not in card.text
    assert card.text.count("## Evaluation") == 1


def _metadata(model: str, vision: str | None, audio: str | None, scheme: str = "W4A16") -> dict:
    return {
        "source": {"model": model, "architecture": "X"},
        "adapter": {"vision_tower": vision, "audio_tower": audio},
        "recipe": {"name": "w4a16", "method": "gptq"},
        "resolved_scheme": {"preset": scheme, "gptq": {"actorder": "static", "dampening_frac": 0.01}},
    }


@pytest.mark.parametrize(
    "vision, audio, tag",
    [
        (None, None, "text-generation"),
        ("model.visual", None, "image-text-to-text"),
        ("thinker.visual", "thinker.audio_tower", "any-to-any"),
    ],
)
def test_pipeline_tag_follows_the_towers(vision, audio, tag):
    data = front_matter(_metadata("/models/m", vision, audio))
    assert data["pipeline_tag"] == tag
    assert {"gptq", "w4a16", "compressed-tensors"} <= set(data["tags"])


@pytest.mark.parametrize(
    "source, expected",
    [
        (
            "/root/.cache/huggingface/hub/models--Qwen--Qwen2.5-Omni-3B/snapshots/abc123",
            ("Qwen/Qwen2.5-Omni-3B", True),
        ),
        ("HuggingFaceTB/SmolLM2-135M", ("HuggingFaceTB/SmolLM2-135M", True)),
        ("/data/models/my-omni", ("my-omni", False)),
    ],
)
def test_base_model_is_the_hub_id_where_the_path_names_one(source, expected):
    assert base_model_id(source) == expected


def test_every_scheme_says_what_serves_it():
    for scheme in SCHEME_FORMATS:
        spec = SCHEMES[scheme]
        assert spec.vllm_class and spec.vllm_class in spec.card_serving, scheme
