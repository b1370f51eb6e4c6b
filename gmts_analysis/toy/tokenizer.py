"""A character-level ``PreTrainedTokenizerFast`` with bos, eos and pad.

Every printable ASCII character and the newline is one token; ids 0-3 are
``<pad>``, ``<bos>``, ``<eos>``, ``<unk>``. Prompts are encoded with special tokens
(``<bos>`` prepended), responses without. Saved beside each checkpoint so
``AutoTokenizer.from_pretrained(path)`` loads it.
"""

from __future__ import annotations

import string

SPECIALS = ("<pad>", "<bos>", "<eos>", "<unk>")
CHARS = "\n" + "".join(c for c in string.printable if c.isprintable())  # 95 printable + newline


def build_char_tokenizer(chars: str = CHARS):
    """Build the tokenizer; ``len(tok) == 4 + len(chars)``."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {s: i for i, s in enumerate(SPECIALS)}
    for c in chars:
        if c not in vocab:
            vocab[c] = len(vocab)
    tk = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Split(Regex("[\\s\\S]"), behavior="isolated")
    tk.decoder = decoders.Fuse()
    bos = vocab["<bos>"]
    tk.post_processor = processors.TemplateProcessing(
        single="<bos> $A", pair="<bos> $A $B", special_tokens=[("<bos>", bos)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tk, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>", unk_token="<unk>",
        padding_side="left", clean_up_tokenization_spaces=False,
    )
