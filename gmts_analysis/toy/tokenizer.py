"""A character-level ``PreTrainedTokenizerFast`` with bos, eos and pad.

Every printable ASCII character and the newline is one token; ids 0-3 are
``<pad>``, ``<bos>``, ``<eos>``, ``<unk>``. Prompts are encoded with special tokens
(``<bos>`` prepended), responses without. Saved beside each checkpoint so
``AutoTokenizer.from_pretrained(path)`` loads it.

Internally it is a byte-level BPE with no merges (each character is its byte-level
symbol, e.g. space is ``Ġ``), not a word-level vocabulary: transformers 5 loads any
tokenizer saved beside a ``qwen2`` config as ``Qwen2Tokenizer``, which rebuilds a
byte-level BPE pipeline from the saved vocabulary. With byte-level symbols in the
vocabulary that rebuild is the same tokenizer (same ids, same decoding, spaces and
newlines included); with plain characters it silently dropped every space.
"""

from __future__ import annotations

import string

SPECIALS = ("<pad>", "<bos>", "<eos>", "<unk>")
CHARS = "\n" + "".join(c for c in string.printable if c.isprintable())  # 95 printable + newline


def build_char_tokenizer(chars: str = CHARS):
    """Build the tokenizer; ``len(tok) == 4 + len(chars)``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    byte_symbol = _byte_level_symbols()
    vocab = {s: i for i, s in enumerate(SPECIALS)}
    for c in chars:
        if ord(c) > 255:
            raise ValueError(f"character tokenizer: {c!r} is not a single byte")
        sym = byte_symbol[ord(c)]
        if sym not in vocab:
            vocab[sym] = len(vocab)
    tk = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tk.decoder = decoders.ByteLevel()
    bos = vocab["<bos>"]
    tk.post_processor = processors.TemplateProcessing(
        single="<bos> $A", pair="<bos> $A $B", special_tokens=[("<bos>", bos)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tk, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>", unk_token="<unk>",
        padding_side="left", clean_up_tokenization_spaces=False,
    )


def _byte_level_symbols() -> dict[int, str]:
    """GPT-2's byte -> printable-unicode map used by byte-level BPE (``bytes_to_unicode``)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))
