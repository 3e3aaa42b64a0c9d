"""``stratad ctl token new|hash`` (offline): bearer tokens and their entries in the
daemon's identities file (``auth_tokens_file``, docs/security.md)."""

from __future__ import annotations

import argparse
import hashlib
import json
import secrets
import sys

from stratad.ctl.context import EXIT_OK, EXIT_USAGE


def token_digest(token: str) -> str:
    """What the identities file stores for a token: the lowercase hex SHA-256 of its UTF-8.

    The daemon reads the file with the same rule (`stratad.server.auth.token_digest`),
    which ctl does not import: it is a client of the daemon, not part of it.
    """
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def run_token(args: argparse.Namespace) -> int:
    """``token new`` / ``token hash``: what docs/security.md tells operators to run."""
    if args.token_command == "hash":
        token = sys.stdin.readline().strip()
        if not token:
            print("stratad ctl: token hash reads a token on stdin; got none", file=sys.stderr)
            return EXIT_USAGE
        print(token_digest(token))
        return EXIT_OK
    token = secrets.token_urlsafe(32)
    entry = {"tenant": args.for_tenant, "role": args.role}
    if args.name:
        entry["name"] = args.name
    fields = ", ".join(f"{key} = {json.dumps(value)}" for key, value in entry.items())
    print(token)
    print(f'"{token_digest(token)}" = {{ {fields} }}')
    return EXIT_OK


__all__ = ["run_token", "token_digest"]
