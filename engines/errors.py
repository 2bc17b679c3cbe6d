"""One error family for the whole project.

Every foreign error (onnxruntime, safetensors, tokenizers, json, OS) is translated into a
``RungError`` at the place that calls the foreign code. A ``RungError`` carries a message
that names the problem and, where there is one, a hint that says what to do; the CLI prints
exactly that, one line, and exits non-zero.
"""

from __future__ import annotations


class RungError(Exception):
    """Base of every error rung raises on purpose."""

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return f"{self.message} ({self.hint})" if self.hint else self.message


def brief(what: str, kind: str) -> str:
    """What a client is told of a failure inside rung (an unexpected exception of type
    ``kind``): the traceback goes to the log where it is contained, no library's internals
    into an answer."""
    return f"{what} inside rung ({kind}); the daemon's log has the details"


class CheckpointError(RungError):
    """A Hugging Face checkpoint directory cannot be imported."""


class ExportError(RungError):
    """The export failed (graph building, verification out of tolerance, writing)."""


class ManifestError(RungError):
    """An engine directory's manifest is missing, malformed, or from an unknown version."""


class EngineError(RungError):
    """The engine cannot load or run (session creation, shapes, capacity)."""


class TokenizerError(RungError):
    """Tokenizer files are missing or unusable, or a chat template fails to render."""


class GenerationError(RungError):
    """A generation request is invalid (empty prompt, too long, bad sampling values)."""
