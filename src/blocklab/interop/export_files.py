"""The file names of an export folder and the mark its weights carry, shared by both formats."""

from __future__ import annotations

CONFIG_NAME, WEIGHTS_NAME, TOKENIZER_NAME = "config.json", "model.safetensors", "tokenizer.json"
MARKER_KEY = "blocklab_export"  # in model.safetensors' metadata: the format that wrote it


def export_metadata(fmt: str) -> dict[str, str]:
    """safetensors metadata of an export: "format": "pt" is what transformers expects."""
    return {"format": "pt", MARKER_KEY: fmt}
