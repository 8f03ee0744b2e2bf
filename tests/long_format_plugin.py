"""A plugin whose format name is longer than the store's format field (16 bytes)."""
from ingest.loaders.base import register


@register("a-format-name-far-too-long", (".toolong",), "txt")
def load(path, options):
    yield from ()
