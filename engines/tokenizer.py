"""Tokenizer for the serving path: Hugging Face ``tokenizer.json`` files, no transformers.

``read_tokenizer_spec`` reads a checkpoint's tokenizer files once, at export time, into the
manifest's ``TokenizerSpec``. ``Tokenizer`` wraps the ``tokenizers`` library for encoding
and decoding, renders chat templates with jinja2 the way transformers does, and hands out
``StreamDecoder`` objects that turn a growing list of token ids into text without ever
emitting half a UTF-8 character.

A chat is encoded so that only the template's own markers become control tokens: the text
of a message (a request's input, a task's prompt, a model's earlier answer) is always text,
even where it spells a special or added token (``<|im_end|>``, ``<|im_start|>system``).
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Callable, Sequence
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from tokenizers import Tokenizer as _HFTokenizer

from rung.engines.errors import TokenizerError
from rung.engines.manifest import TokenizerSpec

if TYPE_CHECKING:   # jinja2 is imported when a chat template is first compiled (start-up time)
    import jinja2

TOKENIZER_JSON = "tokenizer.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
CHAT_TEMPLATE_FILE = "chat_template.jinja"
SPECIAL_TOKENS_MAP = "special_tokens_map.json"
# Files an engine directory copies from the checkpoint, in this order, when present.
TOKENIZER_FILES = (TOKENIZER_JSON, TOKENIZER_CONFIG, CHAT_TEMPLATE_FILE, SPECIAL_TOKENS_MAP)

_NO_TEMPLATE_HINT = "use --raw or a checkpoint with a chat template"
_REPLACEMENT = "\ufffd"
_PIECES_CACHED = 256   # template pieces kept encoded (a few per task and template)


# -- reading a checkpoint ------------------------------------------------------------------
def _load_hf_tokenizer(path: Path) -> _HFTokenizer:
    """Load ``tokenizer.json`` with the tokenizers library, translating its errors."""
    if not path.is_file():
        raise TokenizerError(
            f"{path}: missing; the checkpoint needs a fast tokenizer `tokenizer.json`",
            "save one with `tokenizer.save_pretrained(...)` from transformers "
            "(a fast tokenizer) into the checkpoint directory",
        )
    try:
        return _HFTokenizer.from_file(str(path))
    except Exception as e:  # the tokenizers library raises plain Exception subclasses
        raise TokenizerError(
            f"{path}: cannot be loaded by the tokenizers library ({e})",
            "re-save the tokenizer with a current transformers/tokenizers version",
        ) from e


def _read_json_object(path: Path) -> dict[str, Any]:
    """Read a JSON file that must hold an object; errors name the file."""
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise TokenizerError(f"{path}: not valid JSON ({e})",
                             "restore the file from the original checkpoint") from e
    if not isinstance(raw, dict):
        raise TokenizerError(f"{path}: top level must be a JSON object",
                             "restore the file from the original checkpoint")
    return raw


def _token_content(value: Any, path: Path, key: str) -> str | None:
    """A special token given as a string or as ``{"content": ..., ...}``; None if unset."""
    if value is None:
        return None
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return str(value["content"])
    raise TokenizerError(f"{path}: {key!r} must be a string or an object with 'content'",
                         "restore the file from the original checkpoint")


def _template_from_config(value: Any, path: Path) -> str | None:
    """``chat_template`` as a string, or a list of ``{"name", "template"}`` (default wins)."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, list) and value:
        named = {t.get("name"): t.get("template") for t in value if isinstance(t, dict)}
        chosen = named["default"] if "default" in named else next(iter(named.values()), None)
        if isinstance(chosen, str):
            return chosen
    raise TokenizerError(
        f"{path}: 'chat_template' must be a string or a list of {{name, template}} objects",
        "restore the file from the original checkpoint")


def _read_chat_template(hf_dir: Path, config: dict[str, Any], config_path: Path) -> str | None:
    """The chat template: ``chat_template.jinja`` (transformers 5) wins over the config."""
    jinja_path = hf_dir / CHAT_TEMPLATE_FILE
    if jinja_path.is_file():
        try:
            return jinja_path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise TokenizerError(f"{jinja_path}: cannot be read ({e})",
                                 "restore the file from the original checkpoint") from e
    return _template_from_config(config.get("chat_template"), config_path)


def _special_token(key: str, config: dict[str, Any], config_path: Path,
                   special_map: dict[str, Any], map_path: Path) -> str | None:
    """A special token's text from tokenizer_config.json, else special_tokens_map.json."""
    if config.get(key) is not None:
        return _token_content(config[key], config_path, key)
    return _token_content(special_map.get(key), map_path, key)


def _token_id(tok: _HFTokenizer, token: str | None) -> int | None:
    """Vocabulary id of a token's text, or None when unset or unknown."""
    if token is None:
        return None
    found = tok.token_to_id(token)
    return None if found is None else int(found)


def _unique(ids: Sequence[int]) -> list[int]:
    """Drop repeated ids, keeping first occurrences in order."""
    return list(dict.fromkeys(int(i) for i in ids))


def read_tokenizer_spec(hf_dir: Path, extra_eos_ids: Sequence[int] = ()) -> TokenizerSpec:
    """Read a local Hugging Face checkpoint's tokenizer files into a ``TokenizerSpec``.

    ``tokenizer.json`` is required; ``tokenizer_config.json``, ``chat_template.jinja`` and
    ``special_tokens_map.json`` are optional. ``extra_eos_ids`` (for example from
    ``generation_config.json``) are appended to the eos token's id, duplicates dropped.

    Raises:
        TokenizerError: ``tokenizer.json`` missing or unloadable, a JSON file corrupt, a
            field of the wrong type, or the eos token not in the vocabulary.
    """
    hf_dir = Path(hf_dir)
    tok = _load_hf_tokenizer(hf_dir / TOKENIZER_JSON)
    config_path = hf_dir / TOKENIZER_CONFIG
    map_path = hf_dir / SPECIAL_TOKENS_MAP
    config = _read_json_object(config_path) if config_path.is_file() else {}
    special_map = _read_json_object(map_path) if map_path.is_file() else {}

    def special(key: str) -> str | None:
        return _special_token(key, config, config_path, special_map, map_path)

    bos_token, eos_token = special("bos_token"), special("eos_token")
    pad_token = special("pad_token")
    eos_id = _token_id(tok, eos_token)
    if eos_token is not None and eos_id is None:
        raise TokenizerError(f"{hf_dir}: eos token {eos_token!r} is not in the vocabulary",
                             "check tokenizer_config.json against tokenizer.json")
    return TokenizerSpec(
        files=[name for name in TOKENIZER_FILES if (hf_dir / name).is_file()],
        chat_template=_read_chat_template(hf_dir, config, config_path),
        bos_token=bos_token,
        bos_token_id=_token_id(tok, bos_token),
        eos_token_ids=_unique(([] if eos_id is None else [eos_id]) + list(extra_eos_ids)),
        pad_token_id=_token_id(tok, pad_token),
        add_bos_token=bool(config.get("add_bos_token", False)),
    )


# -- chat templates ------------------------------------------------------------------------
def _raise_exception(message: str) -> NoReturn:
    """``raise_exception`` as chat templates call it: the template refuses the messages."""
    raise TokenizerError(f"chat template refused the messages: {message}",
                         "change the messages (roles, order) to what the model's template "
                         "accepts")


def _strftime_now(fmt: str) -> str:
    """``strftime_now`` as chat templates call it (local time)."""
    return datetime.now().strftime(fmt)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    """transformers' ``tojson`` filter: no HTML escaping, non-ASCII kept."""
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _compile_template(source: str) -> jinja2.Template:
    """Compile a chat template in a sandbox configured like transformers does."""
    import jinja2
    import jinja2.ext
    import jinja2.sandbox

    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    try:
        return env.from_string(source)
    except jinja2.TemplateSyntaxError as e:
        raise TokenizerError(f"chat template: syntax error on line {e.lineno}: {e.message}",
                             "fix the template or use --raw") from e


# -- the tokenizer -------------------------------------------------------------------------
class Tokenizer:
    """Encode, decode and chat-render for one engine; built with ``Tokenizer.load``."""

    def __init__(self, hf: _HFTokenizer, spec: TokenizerSpec) -> None:
        self._hf = hf
        self._spec = spec
        self._template: jinja2.Template | None = None
        self._texts: list[str] | None = None
        added = hf.get_added_tokens_decoder()
        self._special_ids = frozenset(int(i) for i, t in added.items() if t.special)
        # every id that text must never encode to: added tokens (special or not: a
        # tokenizer splits both out of text) and the spec's bos, eos and pad
        self._control_ids = frozenset(int(i) for i in added) | frozenset(
            i for i in (*spec.eos_token_ids, spec.bos_token_id, spec.pad_token_id)
            if i is not None)
        # their spellings, longest first (a message holding one is encoded piece by piece)
        spellings = sorted({t.content for t in added.values() if t.content}, key=len,
                           reverse=True)
        self._spellings = re.compile("|".join(map(re.escape, spellings))) if spellings \
            else None
        self._plain: _HFTokenizer | None = None   # built when a message first needs it
        self._pieces: dict[str, list[int]] = {}
        eos = spec.eos_token_ids
        self._eos_token = hf.id_to_token(eos[0]) if eos else None

    @classmethod
    def load(cls, directory: Path, spec: TokenizerSpec) -> Tokenizer:
        """Load ``directory/tokenizer.json`` and pair it with the manifest's spec.

        Raises:
            TokenizerError: the file is missing or the tokenizers library rejects it.
        """
        return cls(_load_hf_tokenizer(Path(directory) / TOKENIZER_JSON), spec)

    # -- properties ----------------------------------------------------------------------
    @property
    def spec(self) -> TokenizerSpec:
        """The manifest's tokenizer section this tokenizer was loaded with."""
        return self._spec

    @property
    def vocab_size(self) -> int:
        """Number of ids, added tokens included."""
        return int(self._hf.get_vocab_size(with_added_tokens=True))

    @property
    def eos_token_ids(self) -> list[int]:
        """Ids that end generation."""
        return list(self._spec.eos_token_ids)

    @property
    def bos_token_id(self) -> int | None:
        """Id of the beginning-of-sequence token, if the model has one."""
        bos: int | None = self._spec.bos_token_id
        return bos

    @property
    def pad_token_id(self) -> int | None:
        """Id of the padding token, if the model has one."""
        pad: int | None = self._spec.pad_token_id
        return pad

    def is_special(self, token_id: int) -> bool:
        """Whether an id is a special token (added as special, bos, eos or pad)."""
        return (token_id in self._special_ids or token_id in self._spec.eos_token_ids
                or token_id in (self._spec.bos_token_id, self._spec.pad_token_id))

    # -- text <-> ids --------------------------------------------------------------------
    def encode(self, text: str, add_bos: bool | None = None) -> list[int]:
        """Tokenize ``text`` as-is (no post-processor special tokens).

        ``add_bos`` (None: the spec's ``add_bos_token``) prepends the BOS id unless the
        text already starts with it or the model has none.
        """
        ids: list[int] = self._hf.encode(text, add_special_tokens=False).ids
        return self._with_bos(ids, add_bos)

    def encode_text(self, text: str) -> list[int]:
        """Tokenize ``text`` as text only: a special or added token's spelling in it (e.g.
        ``<|im_end|>``) is encoded as the characters it is made of, never as that token.

        Raises:
            TokenizerError: the vocabulary still turns the text into a control token.
        """
        if self._plain is None:
            self._plain = self._text_only_tokenizer()
        ids: list[int] = self._plain.encode(text, add_special_tokens=False).ids
        control = next((i for i in ids if i in self._control_ids), None)
        if control is not None:
            raise TokenizerError(
                f"text encodes to the control token {self._hf.id_to_token(control)!r} "
                "even with special tokens off",
                "remove that token's spelling from the text")
        return ids

    def _text_only_tokenizer(self) -> _HFTokenizer:
        """A copy of the tokenizer whose added tokens are all special and not split out of
        text (the tokenizers library's ``encode_special_tokens``; alone it still splits
        out added tokens that are not special)."""
        data = json.loads(self._hf.to_str())
        for token in data.get("added_tokens") or []:
            token["special"] = True
        plain = _HFTokenizer.from_str(json.dumps(data))
        plain.encode_special_tokens = True
        return plain

    def _with_bos(self, ids: list[int], add_bos: bool | None) -> list[int]:
        """``ids`` with the BOS id in front when ``add_bos`` (None: the spec's
        ``add_bos_token``) asks for it and it is not there already."""
        bos = self._spec.bos_token_id
        want_bos = self._spec.add_bos_token if add_bos is None else add_bos
        if want_bos and bos is not None and (not ids or ids[0] != bos):
            ids.insert(0, bos)
        return ids

    def decode(self, ids: Sequence[int], skip_special: bool = False) -> str:
        """Text of ``ids``; special tokens are kept unless ``skip_special``."""
        return str(self._hf.decode(list(ids), skip_special_tokens=skip_special))

    def token_texts(self) -> list[str]:
        """Each id's text decoded alone, by id (computed once: ~0.1 s for 150k ids)."""
        if self._texts is None:
            self._texts = [str(t) for t in self._hf.decode_batch(
                [[i] for i in range(self.vocab_size)], skip_special_tokens=False)]
        return self._texts

    # -- chat ----------------------------------------------------------------------------
    def render_chat(self, messages: list[dict[str, str]],
                    add_generation_prompt: bool = True) -> str:
        """Render the chat template for ``messages`` (``[{"role", "content"}, ...]``).

        Raises:
            TokenizerError: no template, a template syntax error, or a render error
                (including the template's own ``raise_exception``).
        """
        template = self._compiled_template()
        try:
            return template.render(
                messages=messages, add_generation_prompt=add_generation_prompt,
                bos_token=self._spec.bos_token or "", eos_token=self._eos_token or "")
        except TokenizerError:
            raise
        except Exception as e:  # template code can fail in any way; name it, don't crash
            raise TokenizerError(f"chat template failed to render: {type(e).__name__}: {e}",
                                 "check the messages, or use --raw") from e

    def encode_chat(self, messages: list[dict[str, str]], add_generation_prompt: bool = True,
                    render: Callable[[list[dict[str, str]]], str] | None = None) -> list[int]:
        """Render the chat template and encode it, never doubling a BOS the template wrote.

        Only the template's own markers become control tokens: a message's ``content`` is
        text, and where it spells a special or added token (``<|im_end|>`` ...) that
        spelling is encoded as text (``encode_text``), so a message cannot close its turn
        or open another. A chat whose messages spell none encodes exactly as its rendered
        text does (``encode``); one that does is encoded piece by piece: the template's
        text between the messages as it is, each message's content as text.

        ``render`` (default: ``render_chat`` with ``add_generation_prompt``) turns the
        messages into the prompt text, e.g. a caller's that works around a template
        without a system role.

        Raises:
            TokenizerError: as ``render_chat``; or a message spells a control token and
                the template rewrites messages' text (so where a message's text lies in the
                prompt is unknown).
        """
        if render is None:
            def render(chat: list[dict[str, str]]) -> str:
                return self.render_chat(chat, add_generation_prompt)
        text = render(messages)
        bos = self._spec.bos_token
        add_bos = False if bos and text.startswith(bos) else None
        ids: list[int] = self._hf.encode(text, add_special_tokens=False).ids
        marks = [i for i in ids if i in self._control_ids]
        if not marks:   # no control token at all: nothing a message could have added
            return self._with_bos(ids, add_bos)
        contents = [m.get("content") for m in messages]
        split = self._template_pieces(messages, render)
        if split is None:   # the template cannot be rendered around stand-ins
            if any(self._spells_control(c) or (isinstance(c, str) and set(
                    self.encode(c, add_bos=False)) & self._control_ids) for c in contents):
                raise self._entangled()
            return self._with_bos(ids, add_bos)
        pieces, slots = split
        piece_ids = [self._piece_ids(p) for p in pieces]
        if (marks == [i for p in piece_ids for i in p if i in self._control_ids]
                and not any(self._spells_control(contents[k]) for k in slots)):
            return self._with_bos(ids, add_bos)   # every control token is the template's
        if pieces[0] + "".join(str(contents[k]) + p
                               for k, p in zip(slots, pieces[1:], strict=True)) != text:
            raise self._entangled()
        out = list(piece_ids[0])
        for k, p in zip(slots, piece_ids[1:], strict=True):
            out += self.encode_text(str(contents[k])) + p
        return self._with_bos(out, add_bos)

    def _template_pieces(self, messages: list[dict[str, str]],
                         render: Callable[[list[dict[str, str]]], str],
                         ) -> tuple[list[str], list[int]] | None:
        """The template's own text around the messages' contents: the chat rendered with
        each string content replaced by a stand-in no message holds, split at the
        stand-ins (``pieces``, one more than ``slots``: which message's content lies
        between two pieces); None when the template refuses the stand-ins."""
        nonce = secrets.token_hex(8)
        chat = [{**m, "content": f"\ue000{nonce}:{k}\ue001"}
                if isinstance(m.get("content"), str) else m for k, m in enumerate(messages)]
        try:
            skeleton = render(chat)
        except TokenizerError:
            return None
        parts = re.split(f"\ue000{nonce}:(\\d+)\ue001", skeleton)
        return parts[0::2], [int(k) for k in parts[1::2]]

    def _piece_ids(self, piece: str) -> list[int]:
        """A template piece's ids, its markers control tokens (cached: the same pieces come
        back with every prompt of a task)."""
        ids = self._pieces.get(piece)
        if ids is None:
            if len(self._pieces) >= _PIECES_CACHED:
                self._pieces.clear()
            ids = self._pieces[piece] = self._hf.encode(piece, add_special_tokens=False).ids
        return ids

    def _spells_control(self, text: Any) -> bool:
        """Whether ``text`` holds an added token's spelling as it is."""
        return (isinstance(text, str) and self._spellings is not None
                and self._spellings.search(text) is not None)

    @staticmethod
    def _entangled() -> TokenizerError:
        return TokenizerError(
            "a message spells a control token and the chat template rewrites message "
            "text, so it cannot be kept apart from the template's own markers",
            "remove special-token text such as '<|im_end|>' from the input")

    def _compiled_template(self) -> jinja2.Template:
        if self._template is None:
            if not self._spec.chat_template:
                raise TokenizerError("this model's tokenizer has no chat template",
                                     _NO_TEMPLATE_HINT)
            self._template = _compile_template(self._spec.chat_template)
        return self._template

    # -- streaming -----------------------------------------------------------------------
    def stream(self, skip_special: bool = False, context: Sequence[int] = ()) -> StreamDecoder:
        """A new ``StreamDecoder`` over this tokenizer (see there for ``context``)."""
        return StreamDecoder(self, skip_special=skip_special, context=context)


class StreamDecoder:
    """UTF-8-safe incremental detokenization of a growing list of token ids.

    Uses the prefix-offset technique of HF TGI and vLLM: the ids from ``prefix_offset`` on
    are decoded and compared with the decoding of ``[prefix_offset, read_offset)``; the
    difference is new text, held back while it ends in U+FFFD (a character whose bytes are
    not all there yet). Only a small window of ids is kept and decoded per token.

    ``context`` seeds the window with a few preceding ids (the prompt's tail) so that
    decoders that strip a leading space from the first token (SentencePiece "▁") keep it
    for the first generated token; the context's own text is never emitted.
    """

    _CONTEXT_IDS = 6  # prompt ids kept as context; enough for any one character

    def __init__(self, tokenizer: Tokenizer, skip_special: bool = False,
                 context: Sequence[int] = ()) -> None:
        self._tok = tokenizer
        self._skip = skip_special
        self._window: list[int] = [int(i) for i in context][-self._CONTEXT_IDS:]
        self._read = len(self._window)  # window[:_read] is already accounted for
        self._parts: list[str] = []

    @property
    def text(self) -> str:
        """All text emitted so far by ``push`` and ``flush``."""
        return "".join(self._parts)

    def push(self, token_id: int) -> str:
        """Add one id; return the text it completes ("" while a character is incomplete)."""
        self._window.append(int(token_id))
        prefix_text = self._decode(self._window[:self._read])
        full_text = self._decode(self._window)
        if len(full_text) <= len(prefix_text) or full_text.endswith(_REPLACEMENT):
            return ""
        return self._emit(full_text[len(prefix_text):])

    def flush(self) -> str:
        """Return whatever is held back, even an incomplete character (as U+FFFD)."""
        if self._read >= len(self._window):
            return ""
        prefix_text = self._decode(self._window[:self._read])
        return self._emit(self._decode(self._window)[len(prefix_text):])

    def _emit(self, delta: str) -> str:
        """Record ``delta`` as emitted and slide the window past the emitted ids."""
        del self._window[:self._read]
        self._read = len(self._window)
        self._parts.append(delta)
        return delta

    def _decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids, skip_special=self._skip) if ids else ""
