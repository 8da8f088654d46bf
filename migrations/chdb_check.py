#!/usr/bin/env python3
"""Run every migration through chdb, an embedded current ClickHouse engine.

The tests apply the same files to ClickHouse 18.16 (Debian's server); this is
the second check, that nothing in them is gone from current ClickHouse.
Usage: chdb_check.py [SQL_DIR]. Exit 1 naming the file and statement that
failed, or print the engine version and the number of statements run.
"""
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


def main() -> int:
    sql_dir = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).parent / "sql")
    files = sorted(p for p in sql_dir.glob("*.sql") if re.match(r"^\d{3}_", p.name))
    if not files:
        print(f"no migrations found in {sql_dir}", file=sys.stderr)
        return 1
    s = session.Session()
    version = str(s.query("SELECT version()")).strip().strip('"')
    s.query("CREATE DATABASE IF NOT EXISTS sluice")
    s.query("USE sluice")
    count = 0
    for rnd in (1, 2):  # twice: every statement must be idempotent
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
    print(f"chdb {version}: {len(files)} migrations, {count} statements ran (each twice)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
