"""One module per format. Importing this package registers the built-in loaders."""
from .base import (Block, Page, LoaderError, LoaderOptions, OcrOptions, Unsupported, register, loader_for,
                   format_for_extension, pool_for, formats)

from . import text, pdf, docx, pptx, image, legacy  # noqa: E402,F401  (registration side effect)

__all__ = ["Block", "Page", "LoaderError", "LoaderOptions", "OcrOptions", "Unsupported", "register", "loader_for",
           "format_for_extension", "pool_for", "formats"]
