"""speccap: edge-cloud speculative decoding of speech emotion captions."""

from .numba_cache import configure as _configure_numba_cache

__version__ = "0.1.0"

# before anything imports numba: its cache goes to a directory of ours, never into site-packages
_configure_numba_cache()
