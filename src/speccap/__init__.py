"""speccap: edge-cloud speculative decoding of speech emotion captions."""

from .numba_cache import configure as _configure_numba_cache
from .params_reads import install_from_env as _record_params_reads

__version__ = "0.1.0"

# before anything imports numba: its cache goes to a directory of ours, never into site-packages
_configure_numba_cache()
# $SPECCAP_RECORD_PARAMS set: record which params this process reads (stage_params.uncovered checks them)
_record_params_reads()
