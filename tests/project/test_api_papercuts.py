"""Issue 27.16: the Python API's papercuts. Natural head spellings, text into contributions, errors in the API's
own words (not CLI flags), an empty list, a capture folder that does not exist."""

from __future__ import annotations

import pytest
import torch
from bertscope.hooks.interventions import ablate_heads, parse_heads, patch_heads

import bertscope

TEXTS = ["The cat sat on the mat.", "Dogs bark."]


@pytest.mark.parametrize("spelling", [(3, 5), {3: 5}, "L3H5", "l3h5", [(3, 5)], {3: [5]}, ["L3H5"]])
def test_ablate_heads_reads_natural_spellings_of_one_head(bundled, spelling):
    """`ablate_heads(model, (3, 5))`, `{3: 5}` and `"L3H5"` gave raw TypeErrors; each now means layer 3 head 5."""
    reference = ablate_heads(bundled, {3: [5]})
    hooks = ablate_heads(bundled, spelling)
    assert [name for name, _ in hooks] == [name for name, _ in reference] == ["blocks.3.attn.hook_z"]
    with torch.no_grad():
        assert torch.equal(bundled.run_with_hooks(TEXTS, fwd_hooks=hooks),
                           bundled.run_with_hooks(TEXTS, fwd_hooks=reference))


def test_parse_heads_known_answers_and_errors_that_list_the_spellings():
    assert parse_heads("L3H5,L4H0") == [(3, 5), (4, 0)]
    assert parse_heads([(1, 2), "L3H5"]) == [(1, 2), (3, 5)]
    assert parse_heads({2: [0, 7], 4: 1}) == [(2, 0), (2, 7), (4, 1)]
    for bad in ([3, 5], "x", 3, {3: "a"}, [(1, 2, 3)]):
        with pytest.raises(TypeError, match=r"\{layer: \[head, \.\.\.\]\}.*'L3H5'"):
            parse_heads(bad)


def test_patch_heads_reads_the_same_spellings(bundled):
    with torch.no_grad():
        _, cache = bundled.run_with_cache(TEXTS, names_filter="blocks.2.attn.hook_z")
    assert [n for n, _ in patch_heads(bundled, "L2H1", cache)] == ["blocks.2.attn.hook_z"]


def test_contributions_take_text_like_model_and_run_with_cache(bundled):
    """`bertscope.contributions(model, "text", ...)` refused text while `model()` and `run_with_cache` take it."""
    batch = bundled.to_tokens(TEXTS)
    with torch.no_grad():
        from_text = bertscope.contributions(bundled, TEXTS, "alti", layers=[0, 1])
        from_ids = bertscope.contributions(bundled, batch, "alti", layers=[0, 1])
        one = bertscope.contributions(bundled, TEXTS[1], "attention", layers=[0])
    assert torch.equal(from_text, from_ids)
    assert one.shape == (1, 1, len(bundled.to_str_tokens(TEXTS[1])), len(bundled.to_str_tokens(TEXTS[1])))


def test_api_errors_speak_the_apis_words_not_cli_flags():
    """`bertscope.load(device="cuda")` said "--device cuda: ..." to a Python caller."""
    from bertscope.models.devices import DeviceError, resolve_device, resolve_dtype

    for call, api, cli in [(lambda: resolve_device("tpu"), "device='tpu'", "--device 'tpu'"),
                           (lambda: resolve_dtype("int7"), "dtype='int7'", "--dtype 'int7'")]:
        with pytest.raises(DeviceError) as err:
            call()
        assert str(err.value).startswith(api) and "--" not in str(err.value)
        assert err.value.cli_message().startswith(cli)
    if not torch.cuda.is_available():
        with pytest.raises(DeviceError, match=r"^device='cuda': CUDA is not available.*use device='cpu'") as err:
            bertscope.load(device="cuda")
        assert "--" not in str(err.value)


def test_an_empty_list_is_called_empty_not_refused_as_a_list(bundled):
    """`model([])` said lists were not accepted (they are, as text)."""
    for call in (lambda: bundled([]), lambda: bundled.run_with_cache([])):
        with pytest.raises(ValueError, match="empty list"):
            call()
    with pytest.raises(TypeError, match="must hold strings.*torch.Tensor"):
        bundled([[101, 102]])


def test_load_capture_of_a_missing_folder_says_it_does_not_exist(tmp_path):
    """`load_capture("nope/")` said "rerun the capture" for a folder that never existed."""
    from bertscope.experiments.capture import CaptureError

    with pytest.raises(CaptureError, match="does not exist") as err:
        bertscope.load_capture(tmp_path / "nope")
    assert "rerun" not in str(err.value)
    (tmp_path / "empty").mkdir()
    with pytest.raises(CaptureError, match="holds no capture") as err:
        bertscope.load_capture(tmp_path / "empty")
    assert "rerun" not in str(err.value)
    (tmp_path / "half").mkdir()
    (tmp_path / "half" / "shard-00000.safetensors").write_bytes(b"")
    with pytest.raises(CaptureError, match="unfinished.*rerun"):
        bertscope.load_capture(tmp_path / "half")


@pytest.mark.parametrize(("name", "module"), [("explore", "bertscope.experiments.explorer"),
                                              ("load_capture", "bertscope.experiments.capture")])
def test_lazy_entry_points_show_their_real_signature(name, module):
    """`help(bertscope.explore)` showed `(*args, **kwargs)`: the lazy wrappers now carry the real parameters
    (names, kinds and defaults equal to the function they call)."""
    import importlib
    import inspect

    wrapper = inspect.signature(getattr(bertscope, name))
    real = inspect.signature(getattr(importlib.import_module(module), name))
    assert [(p.name, p.kind, p.default) for p in wrapper.parameters.values()] == [
        (p.name, p.kind, p.default) for p in real.parameters.values()]
    assert "args" not in wrapper.parameters and "kwargs" not in wrapper.parameters


def test_watching_leaves_outputs_bit_identical_except_pattern_and_scores(bundled):
    """27.1: the README said "watching a tensor never changes the numbers"; what holds: every hook but
    hook_scores/hook_pattern leaves the fused output bit-identical, and those two switch the layer to the explicit
    path, moving outputs by float32 rounding within the kernel promise."""
    from helpers import assert_close_across_kernels

    with torch.no_grad():
        plain = bundled(TEXTS)
        others = [n for n in bundled.hook_names() if not n.endswith(("hook_scores", "hook_pattern"))]
        watched, cache = bundled.run_with_cache(TEXTS, names_filter=others)
        with_pattern, _ = bundled.run_with_cache(TEXTS, names_filter="blocks.*.attn.hook_pattern")
    assert len(cache) == len(others) and torch.equal(watched, plain)
    real = bundled.to_tokens(TEXTS)["attention_mask"].bool()
    assert_close_across_kernels(with_pattern[real], plain[real])
