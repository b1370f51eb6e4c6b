"""Text back to the token ids the policy saw, and a report of what was restored.

Ids given in the rollouts are used as they are: they are the only exact record. Text is
tokenized as follows (docs/definitions.md section 7):

- **Message-list prompts** (ours, or TRL's conversational rows) go through the tokenizer's
  chat template with the generation prompt, then are tokenized without adding special
  tokens: exactly ``apply_chat_template(messages, add_generation_prompt=True, tokenize=True)``,
  which is what TRL feeds the policy.
- **Text prompts** are tokenized with the tokenizer's special tokens and no template
  (``--chat-template auto`` or ``off``): exactly what TRL does with a text prompt
  (``processing_class(text=prompts)``). ``--chat-template on`` wraps a text prompt as one
  user message and applies the template (for logs of raw questions that were templated).
- **verl's** ``input`` is the templated prompt decoded *without* special tokens, so the
  template's markers are gone. With ``auto`` or ``on`` and a tokenizer with a chat template,
  the reader restores it when the text is exactly the template's rendering of one user
  message with those markers removed (checked by rendering the found question again and
  comparing), and the template leaves visible role text around the message (ChatML's
  ``user``/``assistant`` lines) to anchor the match; otherwise the text is probed as logged
  and counted as not restored (``on`` refuses instead). A prompt with a custom system
  message or several turns does not match and is not restored.
- **Responses** are tokenized without special tokens. A TRL or verl response was decoded
  with ``skip_special_tokens=True``, which drops the stop token the policy emitted and was
  trained on: it gets the tokenizer's EOS back, unless it hit the length limit
  (``--max-completion-length``: re-tokenized length >= the limit means it was cut).

Text longer than the model's context can hold is refused *before* tokenization, by a
character bound: no token of the vocabulary decodes to more characters than its longest
entry, so ``len(text) > context * longest`` means more tokens than the context. With
``--truncate`` only that many characters are tokenized.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from gmts_analysis.errors import GmtsError
from gmts_analysis.readers.formats import format_entry
from gmts_analysis.readers.sources import check_ids, check_messages, check_text

CHAT_TEMPLATE_MODES = ("auto", "on", "off")
_SENTINEL = "GMTSQUESTIONPLACEHOLDER"


@dataclass
class ContextReport:
    """What the reader restored (and could not), for the manifest and the console."""

    prompts_from_ids: int = 0
    responses_from_ids: int = 0
    template_applied_messages: int = 0  # message-list prompts rendered with the chat template
    template_applied_text: int = 0  # text prompts wrapped as a user message (--chat-template on)
    template_restored_verl: int = 0  # verl inputs matched to the template and re-rendered
    template_not_restored: int = 0  # verl inputs probed as logged (no template, or no match)
    text_prompts_plain: int = 0  # text prompts tokenized with special tokens, no template
    tokenizer_has_template: bool = False
    eos_token: str | None = None
    eos_token_id: int | None = None
    eos_appended: int = 0
    eos_not_appended_length_limit: int = 0
    eos_not_restored_no_token: int = 0
    max_completion_length: int | None = None
    eos_length_limit_unknown: int = 0  # EOS appended without a length limit to tell cut answers
    text_changed_by_tokenizer: int = 0  # text fields whose characters the tokenizer dropped or replaced
    chars_dropped: list[str] = field(default_factory=list)  # those characters, as U+XXXX (the first 16)
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)

    def lines(self) -> list[str]:
        """One-line summaries of what was restored and what could not be."""
        out = []
        if self.template_applied_messages:
            out.append(f"chat template applied (with the generation prompt) to {self.template_applied_messages} "
                       "message-list prompt(s)")
        if self.template_applied_text:
            out.append(f"chat template applied to {self.template_applied_text} text prompt(s) as one user message "
                       "(--chat-template on)")
        if self.template_restored_verl:
            out.append(f"chat template restored on {self.template_restored_verl} verl prompt(s), taken as one user "
                       "message each: the logged text is exactly the template's rendering of it without special tokens")
        if self.template_not_restored:
            out.append(f"could not restore the chat template of {self.template_not_restored} verl prompt(s): probed "
                       "as logged, without the template's special tokens (log prompt_ids to probe exactly)")
        if self.eos_appended:
            out.append(f"stop token {self.eos_token!r} (id {self.eos_token_id}) appended to {self.eos_appended} "
                       "response(s) logged without special tokens")
        if self.eos_not_appended_length_limit:
            out.append(f"{self.eos_not_appended_length_limit} response(s) reach --max-completion-length "
                       f"{self.max_completion_length}: treated as cut at the limit, no stop token")
        if self.eos_length_limit_unknown:
            out.append(f"no --max-completion-length: all {self.eos_length_limit_unknown} logged response(s) got the "
                       "stop token; any that were cut at the length limit are probed with one token too many")
        if self.eos_not_restored_no_token:
            out.append(f"could not restore the stop token of {self.eos_not_restored_no_token} response(s): the "
                       "tokenizer has no eos_token")
        if self.text_prompts_plain and self.tokenizer_has_template:
            out.append(f"{self.text_prompts_plain} text prompt(s) tokenized as given, without the tokenizer's chat "
                       "template although the model has one (as TRL does for text prompts; an instruct model's "
                       "probabilities differ without it: give message lists or --chat-template on to apply it)")
        if self.text_changed_by_tokenizer:
            out.append(f"the tokenizer dropped or replaced characters in {self.text_changed_by_tokenizer} text "
                       f"field(s) ({', '.join(self.chars_dropped)}): those are probed without them (give "
                       "prompt_ids/response_ids to probe exact tokens)")
        return out + list(self.notes)

    def warnings(self) -> list[str]:
        """The lines of :meth:`lines` that change what is probed against what was logged (logged as warnings)."""
        return [x for x in self.lines() if x.startswith(("could not", "no --max", "the tokenizer dropped"))
                or "although the model has one" in x]


class Contextualizer:
    """Turns the text fields of normalized rows into token ids (see the module docstring)."""

    def __init__(self, tokenizer: Any, chat_template: str = "auto", max_completion_length: int | None = None,
                 max_tokens: int | None = None, truncate: bool = False) -> None:
        if chat_template not in CHAT_TEMPLATE_MODES:
            raise GmtsError(f"--chat-template: expected one of {', '.join(CHAT_TEMPLATE_MODES)}, got '{chat_template}'")
        if max_completion_length is not None and (isinstance(max_completion_length, bool)
                                                  or int(max_completion_length) < 1):
            raise GmtsError(f"--max-completion-length: must be at least 1, got {max_completion_length}")
        self.tok = tokenizer
        self.mode = chat_template
        self.limit = None if max_completion_length is None else int(max_completion_length)
        self.max_tokens = max_tokens
        self.truncate = truncate
        self.report = ContextReport(max_completion_length=self.limit)
        self._char_bound: int | None = None
        self._checked_vocab = False
        self._verl_pattern: tuple[str, str] | None | bool = False  # False = not computed yet
        self._specials: list[str] | None = None  # the special tokens' text (:meth:`_special_texts`)
        if tokenizer is not None:
            self.report.eos_token = getattr(tokenizer, "eos_token", None)
            self.report.eos_token_id = getattr(tokenizer, "eos_token_id", None)
            self.report.tokenizer_has_template = bool(getattr(tokenizer, "chat_template", None))

    # ------------------------------------------------------------ helpers

    def _need_tokenizer(self, where: str, name: str) -> None:
        if self.tok is None:
            raise GmtsError(f"{where}: text '{name}' needs a tokenizer, and the model ships none (give {name}_ids)")
        if not self._checked_vocab:
            try:
                n = len(self.tok)
            except TypeError:
                n = len(self.tok.get_vocab())
            if n == 0:
                raise GmtsError(f"{where}: text '{name}' given but the model's tokenizer has an empty vocabulary "
                                f"(no tokenizer files?); give {name}_ids or a model directory with its tokenizer")
            self._checked_vocab = True

    def char_bound(self) -> int | None:
        """Characters beyond which a text surely has more tokens than the model's context."""
        if self.max_tokens is None:
            return None
        if self._char_bound is None:
            longest = max((len(t) for t in self.tok.get_vocab()), default=1)
            self._char_bound = int(self.max_tokens) * max(longest, 1)
        return self._char_bound

    def _bounded(self, text: str, where: str, name: str, cut_ok: bool) -> str:
        bound = self.char_bound()
        if bound is None or len(text) <= bound:
            return text
        if cut_ok and self.truncate:
            return text[:bound]
        raise GmtsError(f"{where}: field '{name}' has {len(text):,} characters, more than the model's context of "
                        f"{self.max_tokens} tokens can hold (no token is longer than {bound // self.max_tokens} "
                        "characters)" + ("; pass --truncate to cut responses to fit" if cut_ok else ""))

    def _encode(self, text: str, where: str, name: str, special: bool) -> list[int]:
        try:
            ids = list(self.tok(text, add_special_tokens=special)["input_ids"])
        except Exception as e:
            raise GmtsError(f"{where}: cannot tokenize field '{name}' ({type(e).__name__})") from None
        if text and not ids:
            raise GmtsError(f"{where}: the tokenizer turned the non-empty field '{name}' into no tokens")
        self._note_dropped(text, ids)
        return ids

    def _special_texts(self) -> list[str]:
        """The text of the tokenizer's special tokens (``<|im_start|>``, ``<bos>``, ...), longest first."""
        if self._specials is None:
            names = {str(t) for t in (getattr(self.tok, "all_special_tokens", None) or [])}
            for t in (getattr(self.tok, "added_tokens_decoder", None) or {}).values():
                if getattr(t, "special", False):
                    names.add(str(getattr(t, "content", t)))
            self._specials = sorted((n for n in names if n), key=len, reverse=True)
        return self._specials

    def _note_dropped(self, text: str, ids: list[int]) -> None:
        """Count a text whose characters do not all come back from its tokens (NUL, bidirectional
        controls, zero-width characters are dropped by some tokenizers), and name those characters.

        The tokens are decoded without their special tokens, so the text of the special tokens (the chat
        template's ``<|im_start|>`` markers) is taken out of ``text`` before comparing: those characters
        are in the ids, as special tokens, not lost."""
        if text.isascii() and text.isprintable():
            return
        try:
            back = self.tok.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)
        except Exception:  # noqa: BLE001 - a tokenizer that cannot decode: nothing to compare
            return
        shown = text
        for special in self._special_texts():
            shown = shown.replace(special, "")
        gone = sorted(set(shown) - set(back))
        if gone:
            self.report.text_changed_by_tokenizer += 1
            for c in gone:
                u = f"U+{ord(c):04X}"
                if u not in self.report.chars_dropped and len(self.report.chars_dropped) < 16:
                    self.report.chars_dropped.append(u)

    def _render(self, messages: list[dict], where: str) -> str:
        if not getattr(self.tok, "chat_template", None):
            raise GmtsError(f"{where}: field 'prompt' needs the chat template (a list of messages, or --chat-template "
                            "on) but the tokenizer has none (give prompt_ids, or a model whose tokenizer has one)")
        try:
            text = self.tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        except Exception as e:
            raise GmtsError(f"{where}: the chat template failed on field 'prompt' ({type(e).__name__}: "
                            f"{str(e).splitlines()[0][:120] if str(e) else ''})") from None
        if not isinstance(text, str):
            raise GmtsError(f"{where}: the chat template did not render text")
        return text

    def _template_ids(self, messages: list[dict], where: str) -> list[int]:
        bound = self.char_bound()
        total = sum(len(m["content"]) for m in messages)
        if bound is not None and total > bound:
            raise GmtsError(f"{where}: field 'prompt' has {total:,} characters of messages, more than the model's "
                            f"context of {self.max_tokens} tokens can hold")
        text = self._bounded(self._render(messages, where), where, "prompt", False)
        return self._encode(text, where, "prompt", special=False)

    # ------------------------------------------------------------ verl

    def _verl_prefix_suffix(self) -> tuple[str, str] | None:
        """The template's rendering of one user message, decoded without special tokens, split at
        the message: what a verl ``input`` looks like around its question."""
        if self._verl_pattern is False:
            self._verl_pattern = None
            try:
                text = self.tok.apply_chat_template([{"role": "user", "content": _SENTINEL}],
                                                    add_generation_prompt=True, tokenize=False)
                shown = self.tok.decode(self.tok(text, add_special_tokens=False)["input_ids"],
                                        skip_special_tokens=True)
                if shown.count(_SENTINEL) == 1:
                    pre, post = shown.split(_SENTINEL)
                    if (pre + post).strip():  # visible role text anchors the match; else it is ambiguous
                        self._verl_pattern = (pre, post)
            except Exception:
                self._verl_pattern = None
        return self._verl_pattern  # type: ignore[return-value]

    def _verl_restore(self, text: str, where: str) -> list[int] | None:
        pat = self._verl_prefix_suffix()
        if pat is None:
            return None
        pre, post = pat
        if len(text) < len(pre) + len(post) or not text.startswith(pre) or not text.endswith(post):
            return None
        question = text[len(pre):len(text) - len(post)]
        ids = self._template_ids([{"role": "user", "content": question}], where)
        if self.tok.decode(ids, skip_special_tokens=True) != text:
            return None
        return ids

    # ------------------------------------------------------------ fields

    def prompt_ids(self, r: dict, where: str) -> list[int]:
        """The prompt's ids: given, or the text/messages tokenized as the module docstring says."""
        if r.get("prompt_ids") is not None:
            self.report.prompts_from_ids += 1
            return check_ids(r["prompt_ids"], where, "prompt_ids")
        v = r.get("prompt")
        fmt = format_entry(r.get("_source"))
        name = (r.get("_missing") or {}).get("prompt", "prompt")
        if v is None:
            raise GmtsError(f"{where}: missing field '{name}'" + ("" if fmt.logged_text else " (or 'prompt_ids')"))
        if isinstance(v, list):
            msgs = check_messages(v, where, name)
            if self.mode == "off":
                raise GmtsError(f"{where}: field '{name}' is a list of chat messages, which needs the chat template "
                                "(--chat-template off)")
            self._need_tokenizer(where, "prompt")
            ids = self._template_ids(msgs, where)
            self.report.template_applied_messages += 1
            return ids
        text = check_text(v, where, name)
        self._need_tokenizer(where, "prompt")
        if fmt.templated_prompt and self.mode != "off" and getattr(self.tok, "chat_template", None):
            ids = self._verl_restore(self._bounded(text, where, name, False), where)
            if ids is not None:
                self.report.template_restored_verl += 1
                return ids
            if self.mode == "on":
                raise GmtsError(f"{where}: field '{name}' is not the chat template's rendering of one user message "
                                "(--chat-template on cannot restore it; use auto or off to probe it as logged)")
            self.report.template_not_restored += 1
        elif self.mode == "on":
            if fmt.templated_prompt:  # no chat template to restore with
                raise GmtsError(f"{where}: --chat-template on, but the tokenizer has no chat template")
            self.report.template_applied_text += 1
            return self._template_ids([{"role": "user", "content": text}], where)
        else:
            self.report.text_prompts_plain += 1
        return self._encode(self._bounded(text, where, name, False), where, name, special=True)

    def response_ids(self, r: dict, where: str) -> list[int]:
        """The response's ids: given, or the text without special tokens (+ EOS for TRL/verl logs)."""
        if r.get("response_ids") is not None:
            self.report.responses_from_ids += 1
            return check_ids(r["response_ids"], where, "response_ids")
        v = r.get("response")
        fmt = format_entry(r.get("_source"))
        name = (r.get("_missing") or {}).get("response", "response")
        if v is None:
            raise GmtsError(f"{where}: missing field '{name}'" + ("" if fmt.logged_text else " (or 'response_ids')"))
        if isinstance(v, list):  # a list of messages: one assistant message's text
            msgs = check_messages(v, where, name)
            if len(msgs) != 1 or msgs[0]["role"] != "assistant":
                raise GmtsError(f"{where}: field '{name}' must be text or one assistant message")
            v = msgs[0]["content"]
        text = check_text(v, where, name)
        self._need_tokenizer(where, "response")
        ids = self._encode(self._bounded(text, where, name, True), where, name, special=False)
        if fmt.logged_text:
            self._restore_eos(ids)
        return ids

    def _restore_eos(self, ids: list[int]) -> None:
        rep = self.report
        if rep.eos_token_id is None:
            rep.eos_not_restored_no_token += 1
            return
        if self.limit is not None and len(ids) >= self.limit:
            rep.eos_not_appended_length_limit += 1
            return
        ids.append(int(rep.eos_token_id))
        rep.eos_appended += 1
        if self.limit is None:
            rep.eos_length_limit_unknown += 1
