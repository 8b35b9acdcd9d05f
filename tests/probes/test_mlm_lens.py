"""The logit lens of ``bertscope.probes.lens``: exact on every family with a masked-LM head, known answers on a
constructed model (the answer written at layer k is found from stream k on; tied and untied decoder; output bias on
and off), refusals for models without a head."""

from __future__ import annotations

import pytest
import torch
import transformers
from bertscope.models import Encoder, load
from bertscope.probes.lens import NoMLMHeadError, hidden_states, logit_lens, logit_lens_streams, stream_hook
from family_fixtures import FAMILIES, save_tiny_family
from fixtures_deberta_modernbert import save_tiny_deberta, save_tiny_modernbert
from helpers import save_tiny_bert
from mlm_fixtures import ANSWER, N_LAYERS, K, V, constructed_mlm

TEXTS = ["The cat sat on the mat.", "Researchers probe attention heads, layer by layer."]
HEADED = ["bert", *FAMILIES, "deberta", "modernbert"]


def _save_mlm(family: str, folder) -> None:
    if family == "bert":
        save_tiny_bert(folder, transformers.BertForMaskedLM, num_hidden_layers=3)
    elif family == "deberta":
        save_tiny_deberta(folder, transformers.DebertaV2ForMaskedLM)
    elif family == "modernbert":
        save_tiny_modernbert(folder, transformers.ModernBertForMaskedLM)
    else:
        save_tiny_family(family, folder, head="mlm")


@pytest.fixture(scope="module", params=HEADED)
def headed(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param)
    _save_mlm(request.param, folder)
    return load(folder)


def test_last_stream_is_mlm_logits_bit_for_bit(headed):
    """The last stream's logit lens is ``mlm_logits`` of the forward output, bit for bit, on every family."""
    batch = headed.tokenize(TEXTS)
    with torch.no_grad():
        expected = headed.mlm_logits(headed(**batch))
        streams = logit_lens_streams(headed, batch["input_ids"], batch["attention_mask"], batch.get("token_type_ids"))
    assert streams.shape == (headed.config.n_layers + 1, *expected.shape)
    assert torch.equal(streams[-1], expected)
    hidden = hidden_states(headed, batch["input_ids"], batch["attention_mask"], batch.get("token_type_ids"))
    with torch.no_grad():
        assert torch.equal(logit_lens(headed, hidden[-1]), expected)
    real = batch["attention_mask"].bool()
    assert torch.equal(
        logit_lens_streams(headed, batch["input_ids"], batch["attention_mask"], batch.get("token_type_ids"),
                           positions=real)[-1], expected[real])  # fmt: skip


def test_bias_off_removes_exactly_the_output_bias(headed):
    """``bias=False`` gives the logits without the head's output bias (Kobayashi et al. 2023)."""
    if headed.mlm_head.bias is None:  # ModernBERT without decoder_bias: on and off agree
        pytest.skip("this checkpoint's head has no output bias")
    torch.manual_seed(1)
    with torch.no_grad():
        headed.mlm_head.bias.copy_(torch.randn_like(headed.mlm_head.bias))
        torch.manual_seed(1)
        hidden = hidden_states(headed, TEXTS)
        on, off = logit_lens(headed, hidden, bias=True), logit_lens(headed, hidden, bias=False)
        headed.mlm_head.bias.zero_()
        zero = logit_lens(headed, hidden, bias=True)
    assert torch.equal(off, zero)
    bias = torch.randn_like(headed.mlm_head.bias)  # the same draw again (seed 1)
    torch.testing.assert_close(on - off, bias.expand_as(on), atol=1e-5, rtol=0)


def test_refuses_models_without_a_head(tmp_path):
    """The bundled sentence encoder and an ELECTRA discriminator have no masked-LM head: one line says so."""
    bundled = load()
    save_tiny_family("electra", tmp_path, head="pretraining")
    discriminator = load(tmp_path)
    for model in (bundled, discriminator):
        with pytest.raises(NoMLMHeadError, match="has no masked-LM head") as err:
            logit_lens(model, torch.zeros(1, 2, model.config.d_model))
        assert "\n" not in str(err.value)
        with pytest.raises(NoMLMHeadError):
            logit_lens_streams(model, ["A dog!"])


# ---------------------------------------------------------------- a constructed MLM with known answers
BIAS_TOKEN = 13


INPUT = torch.tensor([[1, 2, 3, 4, 5]])


def _predictions(model: Encoder, *, bias: bool = True) -> torch.Tensor:
    """Top-1 token of every stream at every position: ``[stream, pos]``."""
    return logit_lens_streams(model, INPUT, bias=bias)[:, 0].argmax(-1)


def test_the_answer_written_at_layer_k_is_found_from_stream_k_on():
    """Streams before K predict each input token itself (tied decoder); from K on, the planted answer."""
    pred = _predictions(constructed_mlm())
    for s in range(N_LAYERS + 1):
        expected = torch.full_like(INPUT[0], ANSWER) if s >= K else INPUT[0]
        assert torch.equal(pred[s], expected), (s, pred[s])
    assert stream_hook(constructed_mlm(), K) == f"blocks.{K - 1}.hook_resid_post"


def test_an_untied_decoder_is_the_one_read():
    """An untied decoder that maps direction j to token (j + 1) mod 16 shifts every prediction by one."""
    shift = 3 * torch.roll(torch.eye(V), shifts=1, dims=0)  # row j+1 is e_j: token j+1 reads direction j
    pred = _predictions(constructed_mlm(decoder=shift))
    assert torch.equal(pred[0], (INPUT[0] + 1) % V)
    assert torch.equal(pred[-1], torch.full_like(INPUT[0], (ANSWER + 1) % V))


def test_output_bias_on_and_off():
    """A large output bias on one token wins everywhere with the bias on and changes nothing with it off."""
    model = constructed_mlm()
    with torch.no_grad():
        model.mlm_head.bias.copy_(1000 * torch.eye(V)[BIAS_TOKEN])
    assert bool((_predictions(model, bias=True) == BIAS_TOKEN).all())
    assert torch.equal(_predictions(model, bias=False), _predictions(constructed_mlm()))
