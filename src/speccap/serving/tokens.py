"""The bearer tokens of the verifier: the server's map of token to client, the edge's own token.
Apart from the server so that an edge device reads its token without the server's web stack."""

from __future__ import annotations

import os
from pathlib import Path

TOKEN_ENV = "SPECCAP_TOKEN"
MIN_TOKEN_CHARS = 16


def load_tokens(token_file: str | os.PathLike | None = None, env: str = TOKEN_ENV) -> dict[str, str]:
    """token -> client name. A token file holds one token per line, or `client:token` to name
    the client (per-client session limits); `#` starts a comment. Without a file, $SPECCAP_TOKEN
    is the one token (client "default"). Never returns an empty map: a server needs a token."""
    tokens: dict[str, str] = {}
    if token_file is not None:
        path = Path(token_file)
        if not path.is_file():
            raise FileNotFoundError(f"token file {path} not found")
        for n, line in enumerate(path.read_text().splitlines(), 1):
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            client, _, token = line.rpartition(":")
            _check_token(token, f"{path}:{n}")
            tokens[token] = client or f"client{len(tokens) + 1}"
        if not tokens:
            raise ValueError(f"token file {path} holds no token")
    else:
        token = os.environ.get(env, "").strip()
        if not token:
            raise ValueError(f"no bearer token: set ${env} or pass --token-file (the server refuses to run open)")
        _check_token(token, f"${env}")
        tokens[token] = "default"
    return tokens


def client_token(token_file: str | os.PathLike | None = None, env: str = TOKEN_ENV) -> str:
    """The edge's token: the first in the file, else $SPECCAP_TOKEN."""
    return next(iter(load_tokens(token_file, env)))


def _check_token(token: str, where: str) -> None:
    if len(token) < MIN_TOKEN_CHARS:
        raise ValueError(f"{where}: a bearer token needs at least {MIN_TOKEN_CHARS} characters "
                         f"(e.g. python -c 'import secrets; print(secrets.token_urlsafe(32))')")
