"""transformers models exported through optimum, as its users do, from a local folder:
a random-weight model from a tiny config is saved with ``save_pretrained`` and
``optimum.exporters.onnx.main_export`` exports that folder (nothing is downloaded).  Runs in
the ``torch`` environment (optimum-onnx pins its own transformers)."""

from __future__ import annotations

import contextlib
import io
import warnings
from pathlib import Path

from optimum.exporters.onnx import main_export

from zoo.export_torch import VOCAB, eager, perturb, seeded


def optimum(model, task: str, work: Path, roles: dict[str, str]) -> dict[str, Path]:
    """Save ``model`` to ``work/pretrained`` and export it for ``task`` into ``work/onnx``;
    ``roles`` maps each role to the file optimum writes for it."""
    perturb(model)
    model.save_pretrained(work / "pretrained")
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        main_export(str(work / "pretrained"), output=work / "onnx", task=task, opset=17, device="cpu",
                    do_validation=False)
    return {role: work / "onnx" / file for role, file in roles.items()}


def bert(work: Path) -> dict[str, Path]:
    from transformers import BertConfig, BertModel

    seeded()
    config = eager(BertConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                              intermediate_size=128, max_position_embeddings=128))
    return optimum(BertModel(config), "feature-extraction", work, {"model": "model.onnx"})


def distilbert(work: Path) -> dict[str, Path]:
    from transformers import DistilBertConfig, DistilBertForSequenceClassification

    seeded()
    config = eager(DistilBertConfig(vocab_size=VOCAB, dim=64, n_layers=2, n_heads=4, hidden_dim=128,
                                    max_position_embeddings=128, num_labels=3))
    return optimum(DistilBertForSequenceClassification(config), "text-classification", work, {"model": "model.onnx"})


def gpt2(work: Path) -> dict[str, Path]:
    from transformers import GPT2Config, GPT2LMHeadModel

    seeded()
    config = eager(GPT2Config(vocab_size=VOCAB, n_positions=128, n_embd=64, n_layer=2, n_head=4, bos_token_id=0,
                              eos_token_id=0))
    return optimum(GPT2LMHeadModel(config), "text-generation-with-past", work, {"model": "model.onnx"})


def llama(work: Path) -> dict[str, Path]:
    from transformers import LlamaConfig, LlamaForCausalLM

    seeded()
    config = eager(LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                               num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128))
    return optimum(LlamaForCausalLM(config), "text-generation-with-past", work, {"model": "model.onnx"})


def t5(work: Path) -> dict[str, Path]:
    from transformers import T5Config, T5ForConditionalGeneration

    seeded()
    config = T5Config(vocab_size=VOCAB, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_decoder_layers=2,
                      num_heads=4, relative_attention_num_buckets=8, decoder_start_token_id=0, dropout_rate=0.0)
    return optimum(T5ForConditionalGeneration(eager(config)), "text2text-generation", work,
                   {"encoder": "encoder_model.onnx", "decoder": "decoder_model.onnx"})


def whisper(work: Path) -> dict[str, Path]:
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    seeded()
    # 1500 encoder positions (3000 mel frames), as every Whisper: optimum's dummy inputs have 3000
    config = WhisperConfig(vocab_size=VOCAB, num_mel_bins=80, d_model=64, encoder_layers=2, decoder_layers=2,
                           encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=128,
                           decoder_ffn_dim=128, max_source_positions=1500, max_target_positions=32,
                           pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=1,
                           suppress_tokens=[], begin_suppress_tokens=[])
    return optimum(WhisperForConditionalGeneration(eager(config)), "automatic-speech-recognition", work,
                   {"encoder": "encoder_model.onnx", "decoder": "decoder_model.onnx"})
