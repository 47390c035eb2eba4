"""Token weights inside GPTQ: H = sum_t w_t x_t x_t^T instead of every token counting the same.

A video sample carries thousands of vision tokens and tens of answer tokens, so the library's
Hessian is dominated by the modality that matters least for the answer. A recipe's
``token_weights`` section (quantkit.recipes.schema.TokenWeights) gives each position a weight,
``w_t = modality(t) x role(t) [x the sample's task-tier weight]``, computed here from the
sample's ``input_ids`` (the model config's media placeholder ids, the chat template's
``<|im_start|>ROLE`` turn markers) and its task label (the taxonomy's tier weights).

:class:`WeightedGPTQModifier` extends llmcompressor's ``GPTQModifier`` without copying it: its
Hessian hook scales each token's input row by ``sqrt(w_t)`` and hands the result to the library's
own hook, so ``accumulate_hessian`` adds ``2 sum_t w_t x_t x_t^T`` and counts samples exactly as
before (the library divides by the number of sequences; GPTQ's solve is invariant to the scale
of H, its dampening being a fraction of H's mean diagonal). A sample whose weights are all 1
passes its input through untouched: uniform weights give today's result to the bit.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from quantkit.errors import CheckFailed, InputError
from quantkit.recipes.schema import TokenWeights

MODALITIES = ("image", "video", "audio")
ROLES = {"system": "system", "user": "user", "assistant": "answer"}
TURN_MARKER = "<|im_start|>"


def media_token_ids(config) -> dict[str, set[int]]:
    """The placeholder token ids of each media kind, from a model config and its sub-configs
    (``image_token_id`` / ``image_token_index``, ...: Qwen2.5-VL, Qwen3-VL, Qwen2.5-Omni, Qwen3-Omni)."""
    found: dict[str, set[int]] = {kind: set() for kind in MODALITIES}

    def walk(node) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                for kind in MODALITIES:
                    if key in (f"{kind}_token_id", f"{kind}_token_index") and isinstance(value, int):
                        found[kind].add(value)
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(config.to_dict() if hasattr(config, "to_dict") else config)
    return found


def _tokenizer(processor):
    return getattr(processor, "tokenizer", processor)


def turn_roles(ids: Sequence[int], tokenizer) -> list[str]:
    """Each position's role (system / user / answer) from the ``<|im_start|>ROLE`` turn markers:
    a position belongs to the turn whose marker came last; before any marker, ``user``."""
    marker = tokenizer.convert_tokens_to_ids(TURN_MARKER)
    if marker is None or marker == tokenizer.unk_token_id:
        raise InputError(
            f"token_weights.role: the tokenizer has no {TURN_MARKER} turn marker, so the roles of "
            "the tokens are unknown",
            hint="leave token_weights.role at its defaults (1) for this model",
        )
    roles, current = [], "user"
    for index, token in enumerate(ids):
        if token == marker:
            # A small vocabulary splits a role name into several tokens: read a few, no spaces.
            head = "".join(tokenizer.decode(list(ids[index + 1 : index + 12])).split())
            current = next((role for word, role in ROLES.items() if head.startswith(word)), current)
        roles.append(current)
    return roles


def tier_weight(label: str, taxonomy) -> float:
    """The taxonomy's weight for a sample's label: a task name, or a calibration set's stratum
    ``task|modality|bucket`` (quantkit.pool.record.stratum_name)."""
    name = label.split("|", 1)[0]
    task = taxonomy.resolve(name)
    if task is None:
        raise InputError(
            f"token_weights.task_tier: the calibration sample's task {name!r} is not in the taxonomy",
            hint="label the samples with the taxonomy's tasks, or set token_weights.task_tier: false",
        )
    return float(taxonomy.weight(task))


def token_weight_vector(
    ids: Sequence[int],
    settings: TokenWeights,
    *,
    media: dict[str, set[int]],
    roles: Sequence[str] | None = None,
    tier: float = 1.0,
) -> torch.Tensor:
    """One float32 weight per position: modality x role x tier."""
    ids = torch.as_tensor(list(ids), dtype=torch.long)
    modality = torch.full(ids.shape, settings.modality.text, dtype=torch.float32)
    for kind in MODALITIES:
        if media.get(kind):
            hit = torch.isin(ids, torch.tensor(sorted(media[kind]), dtype=torch.long))
            modality[hit] = getattr(settings.modality, kind)
    weights = modality * tier
    if roles is not None:
        weights = weights * torch.tensor(
            [getattr(settings.role, role) for role in roles], dtype=torch.float32
        )
    return weights


def sample_weights(rows, settings: TokenWeights, *, config, processor, taxonomy=None) -> list[torch.Tensor]:
    """The weight vector of every calibration row (quantkit.features.processor.FeatureRow), in
    the rows' order: the order the calibration loader yields them, one sample per batch."""
    media = media_token_ids(config)
    uniform_roles = len({settings.role.system, settings.role.user, settings.role.answer}) == 1
    if settings.task_tier and taxonomy is None:
        from quantkit.taxonomy import load_taxonomy

        taxonomy = load_taxonomy()
    out = []
    for row in rows:
        ids = row.inputs["input_ids"].reshape(-1).tolist()
        roles = None if uniform_roles else turn_roles(ids, _tokenizer(processor))
        tier = tier_weight(row.label, taxonomy) if settings.task_tier else 1.0
        if uniform_roles:
            tier *= settings.role.user  # one role weight for every position
        out.append(token_weight_vector(ids, settings, media=media, roles=roles, tier=tier))
    return out


def weights_summary(settings: TokenWeights, vectors: list[torch.Tensor]) -> dict:
    """quantkit.json's record: the settings and how the weights came out."""
    flat = torch.cat(vectors) if vectors else torch.zeros(0)
    return {
        **settings.model_dump(mode="json"),
        "tokens": int(flat.numel()),
        "zero_weight_tokens": int((flat == 0).sum()),
        "mean_weight": round(float(flat.mean()), 6) if flat.numel() else None,
    }


# ---------------------------------------------------------------------- the library's GPTQ, weighted


def _weighted_gptq_class():
    from llmcompressor.core import active_session
    from llmcompressor.modifiers.quantization import GPTQModifier
    from pydantic import PrivateAttr

    class WeightedGPTQModifier(GPTQModifier):
        """``GPTQModifier`` whose Hessians weigh each token by its weight (module docstring).

        How the weights reach the hook: llmcompressor's calibration pipelines (``sequential``,
        which quantkit runs on the captured decoder inputs, and ``basic``) set
        ``session.state.current_batch_idx`` before each forward of a batch, the same channel
        the library's AWQ reads its per-batch loss masks through. quantkit's loaders are
        unshuffled with one sample per batch, so the batch index names the sample, and its
        weight vector lines up with the positions of every token-wise module input (the
        decoder's sequence length is the processor's ``input_ids`` length). An index tied to
        the data this way survives the sequential pipeline's tracing and its cached
        intermediates, where an extra tensor in the decoder's kwargs would have to be threaded
        through every traced subgraph and every decoder layer's signature.
        """

        _token_weights: list[torch.Tensor] | None = PrivateAttr(default=None)

        def set_token_weights(self, vectors: list[torch.Tensor]) -> None:
            self._token_weights = [v.reshape(-1).to(torch.float32) for v in vectors]

        def calibrate_module(self, module, args, _output):
            if self._token_weights is None:
                return super().calibrate_module(module, args, _output)
            batch = active_session().state.current_batch_idx
            if not 0 <= batch < len(self._token_weights):
                raise CheckFailed(
                    f"token weights: calibration batch {batch} has no weight vector "
                    f"({len(self._token_weights)} samples weighted)"
                )
            weights = self._token_weights[batch]
            if bool((weights == 1).all()):
                return super().calibrate_module(module, args, _output)
            inp = args[0]
            if inp.shape[:-1].numel() != weights.numel():
                raise CheckFailed(
                    f"token weights: module {self._module_names.get(module, module)} sees "
                    f"{inp.shape[:-1].numel()} tokens of sample {batch}, which has {weights.numel()} "
                    "weights (MoE experts see only their routed tokens)",
                    hint="remove token_weights from the recipe for this model",
                )
            scale = weights.to(inp.device).sqrt().reshape(*inp.shape[:-1], 1)
            # float32 rows: the library casts to float32 before x x^T anyway.
            return super().calibrate_module(module, (inp.to(torch.float32) * scale, *args[1:]), _output)

    return WeightedGPTQModifier


_CLASS = None


def weighted_gptq_modifier_class():
    """The ``GPTQModifier`` subclass (built on first use: llmcompressor imports are slow)."""
    global _CLASS
    if _CLASS is None:
        _CLASS = _weighted_gptq_class()
    return _CLASS


def with_token_weights(modifiers: list, vectors: list[torch.Tensor]) -> list:
    """``modifiers`` with each ``GPTQModifier`` replaced by a weighted one, same settings."""
    from llmcompressor.modifiers.quantization import GPTQModifier

    cls = weighted_gptq_modifier_class()
    out = []
    for modifier in modifiers:
        if type(modifier) is GPTQModifier:
            weighted = cls(**{name: getattr(modifier, name) for name in modifier.model_fields_set})
            weighted.set_token_weights(vectors)
            modifier = weighted
        out.append(modifier)
    if not any(isinstance(m, cls) for m in out):
        raise InputError("token_weights need a GPTQ recipe (method: gptq)")
    return out
