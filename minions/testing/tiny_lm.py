"""A tiny random-weight causal LM, built in about a second with no download (ENV.md's recipe):
a byte-level BPE tokenizer trained by `tokenizers` and a 2-layer LlamaForCausalLM."""

from __future__ import annotations

import random
from pathlib import Path

CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)

_WORDS = (
    "the a machine idle laptop embeds text while its owner sleeps quickly slowly model batch task "
    "queue server lease token heartbeat apple silicon gpu memory record output input answer question "
    "why how what when where fast small large network power thermal"
).split()


def _sentences(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(_WORDS) for _ in range(rng.randint(4, 14))).capitalize() + "." for _ in range(n)]


def build(folder: Path, chat_template: str | None = None, seed: int = 0) -> Path:
    """Save a tokenizer and model to `folder` (AutoTokenizer/AutoModelForCausalLM load it); `seed`
    draws the random weights (another seed: another model over the same tokenizer)."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<pad>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(_sentences(400), trainer)
    fast = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]  # untyped upstream
        tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>", pad_token="<pad>")
    if chat_template is not None:
        fast.chat_template = chat_template
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(fast),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        bos_token_id=fast.bos_token_id,
        eos_token_id=fast.eos_token_id,
        pad_token_id=fast.pad_token_id,
    )
    folder.mkdir(parents=True, exist_ok=True)
    LlamaForCausalLM(config).save_pretrained(folder)
    fast.save_pretrained(folder)
    return folder
