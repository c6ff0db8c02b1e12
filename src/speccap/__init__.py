"""speccap: edge-cloud speculative decoding of speech emotion captions."""

__version__ = "0.1.0"
