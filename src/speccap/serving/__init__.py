"""The networked edge-cloud split: the verifier server and the edge client (see docs/serving.md)."""
