"""Durability is the store's (store/log.py), not the domain's.

No module of python/stratad/domain/ fsyncs, renames files, opens, replays or
rewrites journals, or reads journal records by hand: they hand records to the
log engine and get back what it recovered. And one commit path: the domain
waits for durability only through the engine's tickets (store/commit.py's
`sync_all` behind them), never by syncing a journal itself.
"""

from __future__ import annotations

import re
from pathlib import Path

DOMAIN = Path(__file__).resolve().parents[2] / "python" / "stratad" / "domain"

#: What only the store may do with files and journals.
FORBIDDEN = re.compile(
    r"os\.fsync|os\.fdatasync|os\.replace|os\.rename|\.rename\(|fsync_dir|os\.write\b"
    r"|_is_torn_tail|_read_record|\bmmap\b"
    r"|read_records|parse_records|read_journal|rewrite_journal|open_journal|\.truncate\("
    # One commit path: a journal synced by hand, or the commit function called
    # from the domain, is a second one.
    r"|journal\.sync\(|\.sync_now\(|commit\.sync_all|import sync_all"
)

#: Module (relative to domain/) -> why it may still. Empty since sessions moved
#: onto the log engine; it must stay empty.
ALLOWED: dict[str, str] = {}


def offenders() -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for path in sorted(DOMAIN.rglob("*.py")):
        hits = [
            f"{n}: {line.strip()}"
            for n, line in enumerate(path.read_text().splitlines(), 1)
            if FORBIDDEN.search(line)
        ]
        if hits:
            found[path.relative_to(DOMAIN).as_posix()] = hits
    return found


def test_no_domain_module_touches_durability() -> None:
    unexpected = {name: hits for name, hits in offenders().items() if name not in ALLOWED}
    assert not unexpected, f"durability belongs in store/log.py: {unexpected}"


def test_the_allowlist_stays_empty() -> None:
    assert not ALLOWED, "every domain module goes through the log engine"


def test_the_check_sees_what_it_forbids() -> None:
    for line in (
        "os.fsync(fd)",
        "import mmap",
        "journal_mod._read_record(data, pos)",
        "live.path.rename(trash)",
        "self.store.rewrite_journal(path, records)",
        "journal.sync(offset)",
        "old.sync_now()",
        "from stratad.store.commit import sync_all",
        "journal_mod.read_records(path)",
    ):
        assert FORBIDDEN.search(line), line
    for line in ("self.log.append(record)", "ticket.wait()", "self.sync_all()"):
        assert not FORBIDDEN.search(line), line
