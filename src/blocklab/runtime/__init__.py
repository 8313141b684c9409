"""Running a built model: the KV cache, generation, compilation, the chunked loss and offloaded value
tables. `blocklab.model` is the definition and imports nothing from here; `LanguageModel` is the
model with all of this, the class every command builds."""

from blocklab.runtime.cache import KVCache
from blocklab.runtime.generate import generate
from blocklab.runtime.language_model import LanguageModel

__all__ = ["KVCache", "LanguageModel", "generate"]
