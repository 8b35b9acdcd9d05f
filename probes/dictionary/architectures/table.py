"""The one table of dictionary architectures: adding one is a file holding one ``register(Architecture(...))``.

Every list of architecture names (``bertscope.probes.dictionary.ARCHITECTURES``, the ``--arch`` choices of ``bertscope
sae train``, the docs' table) is read from ``TABLE`` when it is asked for, so an architecture registered here (from
any module, a test included) is trained, saved in SAELens's format, loaded and evaluated everywhere at once. The
built-in entries (``relu``, ``topk``, ``batchtopk``, ``jumprelu``) are one file each in this folder.

An architecture is its functions on a dictionary ``d`` (a ``Dictionary``: ``W_enc [d_in, d_sae]``, ``b_enc
[d_sae]``, ``W_dec [d_sae, d_out]``, ``b_dec [d_out]``, ``config``) and pre-activations ``h [rows, d_sae]``:

- ``activate(d, h) -> f [rows, d_sae]``: the inference activation (required);
- ``train_activate(d, h, settings) -> f``: the training activation (default ``activate``);
- ``sparsity_loss(d, h, f, settings, tokens) -> scalar``: the sparsity term added to the MSE (with its
  coefficient and warm-up), None for none;
- ``aux_loss(d, h, y, y_hat, dead, settings) -> scalar``: the auxiliary loss given dead latents ``dead [d_sae]``
  (bool), None for none;
- ``sparse_loss(d, x, y, settings, dead) -> (loss, values [rows, k], indices [rows, k], y_hat)``: an exact sparse
  form of the whole training loss the trainer uses instead (dictionaries without a skip path);
- ``after_step(d, f, settings)``: an update after each optimiser step (BatchTopK's threshold average);
- ``e2e_penalty(d, f) -> scalar``: the sparsity term the end-to-end fine-tune adds (times its ``l1_coefficient``);
- ``setup(d, kw)``: extra parameters or buffers (``kw``: device and dtype); ``init(d, init_threshold)``: their
  initial values; ``threshold(d) -> [d_sae] | None``: the inference threshold; ``load_threshold(d, t [d_sae])``;
  ``revive_threshold(d, idx, h_row, settings)``: a resampled latent's threshold;
- ``saelens``: kind (``sae``, ``transcoder``, ``skip_transcoder``) -> SAELens's architecture name (the kinds it
  supports); ``saelens_fields(config) -> dict``: extra ``cfg.json`` fields; ``saelens_in(cfg, state) -> state``:
  a SAELens file's weights converted to this architecture's convention; ``reads_saelens``: whether a SAELens file
  of that name (without bertscope's metadata) is read as this architecture.

``uses_k``: the config's ``k`` is required (``0 < k < d_sae``); ``unit_norm_decoder``: decoder rows held at unit
norm (and initialised so; else at norm 0.1, SAELens's ``decoder_init_norm``); ``revive``: how dead latents come
back (``"resample"``, ``"auxk"`` or ``"none"``); ``data_parallel``: whether data-parallel training is exact.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

#: the kinds of dictionary: an SAE reads and predicts one site; a transcoder predicts another site
KINDS = ("sae", "transcoder", "skip_transcoder")


@dataclass(frozen=True)
class Architecture:
    """One dictionary architecture: its name, its functions and the facts the trainer, the format and the CLI read
    (see the module docstring for each field)."""

    name: str
    activate: Callable[[Any, Any], Any]
    saelens: Mapping[str, str]
    summary: str = ""
    uses_k: bool = False
    unit_norm_decoder: bool = False
    revive: Literal["resample", "auxk", "none"] = "none"
    train_activate: Callable[..., Any] | None = None
    sparsity_loss: Callable[..., Any] | None = None
    aux_loss: Callable[..., Any] | None = None
    sparse_loss: Callable[..., Any] | None = None
    after_step: Callable[..., None] | None = None
    e2e_penalty: Callable[..., Any] | None = None
    setup: Callable[..., None] | None = None
    init: Callable[..., None] | None = None
    threshold: Callable[[Any], Any] | None = None
    load_threshold: Callable[[Any, Any], None] | None = None
    revive_threshold: Callable[..., None] | None = None
    saelens_fields: Callable[[Any], dict[str, Any]] | None = None
    saelens_in: Callable[[dict[str, Any], dict[str, Any]], dict[str, Any]] | None = None
    reads_saelens: bool = True
    data_parallel: bool = True
    citation: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def kinds(self) -> tuple[str, ...]:
        """The kinds this architecture supports (those SAELens's format has a name for)."""
        return tuple(k for k in KINDS if k in self.saelens)


#: name -> Architecture; the single source of every architecture name
TABLE: dict[str, Architecture] = {}


def register(arch: Architecture, *, replace: bool = False) -> Architecture:
    """Add ``arch`` to the table (``replace=True`` to overwrite an entry of the same name); returns it."""
    if not arch.name or not arch.name.replace("_", "").isalnum():
        raise ValueError(f"an architecture name is letters, digits and '_', got {arch.name!r}")
    unknown = sorted(set(arch.saelens) - set(KINDS))
    if unknown or not arch.saelens:
        raise ValueError(f"Architecture.saelens maps kinds ({', '.join(KINDS)}) to SAELens names, got {arch.saelens}")
    if arch.revive not in ("resample", "auxk", "none"):
        raise ValueError(f"Architecture.revive must be resample, auxk or none, got {arch.revive!r}")
    if arch.name in TABLE and not replace:
        raise ValueError(f"a dictionary architecture named {arch.name!r} is registered already")
    TABLE[arch.name] = arch
    return arch


def unregister(name: str) -> None:
    """Remove ``name`` from the table (tests that register a toy architecture clean up with it)."""
    TABLE.pop(name, None)


def names() -> tuple[str, ...]:
    """Every registered architecture's name, in table order."""
    return tuple(TABLE)


def get(name: str) -> Architecture:
    """The architecture called ``name``; ``ValueError`` (one line, listing every name) for an unknown one."""
    try:
        return TABLE[name]
    except KeyError:
        raise ValueError(f"unknown dictionary architecture {name!r}; choose one of {', '.join(TABLE)}") from None


def with_k() -> tuple[str, ...]:
    """Names of the architectures that take ``k`` (active latents per token)."""
    return tuple(a.name for a in TABLE.values() if a.uses_k)


def for_kind(kind: str) -> tuple[str, ...]:
    """Names of the architectures that support ``kind`` (``sae``, ``transcoder``, ``skip_transcoder``)."""
    return tuple(a.name for a in TABLE.values() if kind in a.saelens)


def from_saelens(saelens_name: str, hint: str | None = None) -> tuple[str, str] | None:
    """``(kind, architecture)`` of a SAELens architecture name; ``hint`` (the architecture bertscope recorded in
    the file's metadata) wins when it is registered and maps that kind to that name. None when unknown."""
    if hint in TABLE:
        for kind, name in TABLE[hint].saelens.items():
            if name == saelens_name:
                return kind, hint
    for arch in TABLE.values():
        if not arch.reads_saelens:
            continue
        for kind, name in arch.saelens.items():
            if name == saelens_name:
                return kind, arch.name
    return None


def saelens_names() -> tuple[str, ...]:
    """Every SAELens architecture name bertscope reads without its own metadata."""
    return tuple(dict.fromkeys(n for a in TABLE.values() if a.reads_saelens for n in a.saelens.values()))


def markdown_table() -> str:
    """The registered architectures as a markdown table (``docs/dictionaries.md``'s generated block)."""
    lines = ["| `--arch` | what it is | `k` | decoder rows | dead latents | SAELens names (kind: name) | source |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for a in TABLE.values():
        names_ = ", ".join(f"{kind}: `{name}`" for kind, name in a.saelens.items())
        lines.append(f"| `{a.name}` | {a.summary} | {'yes' if a.uses_k else 'no'} | "
                     f"{'unit norm' if a.unit_norm_decoder else 'free'} | {a.revive} | {names_} | {a.citation} |")
    return "\n".join(lines)
