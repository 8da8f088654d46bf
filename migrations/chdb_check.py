#!/usr/bin/env python3
"""Run every migration through chdb, an embedded current ClickHouse engine.

The tests apply the same files to ClickHouse 18.16 (Debian's server); this is
the second check, that nothing in them is gone from current ClickHouse.
Usage: chdb_check.py [SQL_DIR] [--config FILE]. Exit 1 naming the file and
statement that failed, or print the engine version and the number of
statements run. --once runs each statement once instead of twice.
--config gives the embedded server a configuration file
(a keeper, macros and clusters, for the statements of the cluster layouts
that migrations_test writes into SQL_DIR).
"""
import os
import pathlib
import re
import sys

from chdb import session


def split_statements(sql: str):
    """Same rule as the Go migrator: statements end at a line ending in ';'."""
    out, cur = [], []
    for line in sql.split("\n"):
        t = line.strip()
        if not t or t.startswith("--"):
            continue
        cur.append(line)
        if t.endswith(";"):
            out.append("\n".join(cur).strip().rstrip(";"))
            cur = []
    if "".join(cur).strip():
        out.append("\n".join(cur).strip())
    return out


# Same rule as the Go migrator's execIdempotent: ClickHouse 18.16 has no
# ADD COLUMN IF NOT EXISTS, so a statement adding one column is skipped when
# the table already has it.
ADD_COLUMN = re.compile(r"^\s*ALTER\s+TABLE\s+(\w+)\s+ADD\s+COLUMN\s+(\w+)\s", re.I | re.S)


def has_column(s: session.Session, stmt: str) -> bool:
    m = ADD_COLUMN.match(stmt)
    if m is None:
        return False
    q = (f"SELECT count() FROM system.columns WHERE database = currentDatabase() "
         f"AND table = '{m.group(1)}' AND name = '{m.group(2)}'")
    return int(str(s.query(q, "CSV")).strip()) > 0


_sessions = []


def main() -> int:
    args = sys.argv[1:]
    config = None
    rounds = (1, 2)
    if "--once" in args:
        # The cluster layouts' check: chdb never activates a replicated
        # table, so one dropped and created again (017) finds its replica
        # still registered in the keeper; the plain check runs each
        # statement twice.
        args.remove("--once")
        rounds = (1,)
    if "--config" in args:
        i = args.index("--config")
        config = args[i + 1]
        del args[i:i + 2]
    sql_dir = pathlib.Path(args[0] if args else pathlib.Path(__file__).parent / "sql")
    files = sorted(p for p in sql_dir.glob("*.sql") if re.match(r"^\d{3}_", p.name))
    if not files:
        print(f"no migrations found in {sql_dir}", file=sys.stderr)
        return 1
    s = session.Session(f":memory:?config-file={config}") if config else session.Session()
    # Kept referenced until os._exit: closing a session with replicated
    # tables (the cluster layouts) hangs in chdb's teardown.
    _sessions.append(s)
    version = str(s.query("SELECT version()")).strip().strip('"')
    s.query("CREATE DATABASE IF NOT EXISTS sluice")
    s.query("USE sluice")
    count = 0
    for rnd in rounds:  # twice: every statement must be idempotent
        for f in files:
            stmts = split_statements(f.read_text())
            for i, stmt in enumerate(stmts, 1):
                try:
                    if has_column(s, stmt):
                        count += 1
                        continue
                    s.query(stmt)
                except Exception as e:  # chdb raises its own error types
                    print(f"chdb {version}: {f.name} statement {i} (round {rnd}) failed: {e}", file=sys.stderr)
                    return 1
                count += 1
    print(f"chdb {version}: {len(files)} migrations, {count} statements ran ({'each twice' if len(rounds) == 2 else 'once each'})", flush=True)
    return 0


if __name__ == "__main__":
    # os._exit: chdb's teardown of a session with replicated tables hangs
    # or aborts the interpreter after the work is done, which must not
    # turn a pass into a failure.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(main())
