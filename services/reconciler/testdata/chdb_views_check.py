#!/usr/bin/env python3
"""Query the report views on current ClickHouse (chdb), not only create them.

migrations/chdb_check.py proves the DDL runs on current ClickHouse; this
loads a small fixture (a mid-month price change, a retried event, an
unpriced model, an event before its model's first price, a soft-quota
overage), checks the views' figures against
hand-computed ones and runs every example query of docs/finance.md.
The Go tests check the same figures on ClickHouse 18.16.
Usage: .services/venv/bin/python services/reconciler/testdata/chdb_views_check.py
"""
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "migrations"))
from chdb_check import split_statements  # noqa: E402
from chdb import session  # noqa: E402


def main() -> int:
    s = session.Session()
    s.query("CREATE DATABASE IF NOT EXISTS sluice")
    s.query("USE sluice")
    for f in sorted((ROOT / "migrations" / "sql").glob("*.sql")):
        for st in split_statements(f.read_text()):
            s.query(st)
    s.query("INSERT INTO prices (model, currency, effective_from, prompt_per_million, completion_per_million, cached_per_million, note, inserted_at) VALUES "
            "('gpt-4o','USD',toDateTime('2026-01-01 00:00:00','UTC'),2.5,10,1.25,'',now()),"
            "('gpt-4o','USD',toDateTime('2026-11-15 00:00:00','UTC'),2,8,1,'',now())")
    s.query("INSERT INTO usage_events (id, time, tenant, model, prompt_tokens, completion_tokens, cached_tokens, kafka_offset) VALUES "
            "('a2', toDateTime('2026-11-14 23:59:59','UTC'), 'acme','gpt-4o',2000,500,1000,1),"
            "('a3', toDateTime('2026-11-15 00:00:00','UTC'), 'acme','gpt-4o',2000,500,1000,2),"
            "('a3', toDateTime('2026-11-15 00:00:00','UTC'), 'acme','gpt-4o',2000,500,1000,3),"
            "('m', toDateTime('2026-11-15 00:00:00','UTC'), 'acme','mystery',50,50,0,4),"
            "('a0', toDateTime('2025-12-31 23:59:59','UTC'), 'early','gpt-4o',10,10,0,5)")
    # An estimate at 23:59:50 settled at 00:00:20 the next day: two day
    # partitions, which FINAL cannot fold (migration 046).
    s.query("INSERT INTO usage_events (id, time, tenant, model, prompt_tokens, completion_tokens, cached_tokens, estimated, kafka_offset) VALUES "
            "('x', toDateTime('2026-11-29 23:59:50','UTC'), 'night','gpt-4o',1000,1000,0,1,6),"
            "('x', toDateTime('2026-11-30 00:00:20','UTC'), 'night','gpt-4o',100,50,0,0,7)")
    # Every token type, priced apart (migrations 051, 052): 1,000 plain
    # input, 2,000 cache reads, 3,000 cache writes, 4,000 plain output,
    # 5,000 reasoning; the gpt-4o rows above, written without the new
    # prices, bill cache writes and reasoning at prompt and completion.
    s.query("INSERT INTO prices (model, currency, effective_from, prompt_per_million, completion_per_million, cached_per_million, "
            "cache_write_per_million, reasoning_per_million, note, inserted_at) VALUES "
            "('claude-x','USD',toDateTime('2026-01-01 00:00:00','UTC'),3,15,0.3,3.75,20,'',now())")
    s.query("INSERT INTO usage_events (id, time, tenant, model, prompt_tokens, completion_tokens, cached_tokens, cache_write_tokens, "
            "reasoning_tokens, kafka_offset) VALUES "
            "('t1', toDateTime('2026-11-10 10:00:00','UTC'), 'types','claude-x',6000,9000,2000,3000,5000,8),"
            "('t2', toDateTime('2026-11-10 10:00:00','UTC'), 'types','gpt-4o',6000,9000,2000,3000,5000,9)")
    s.query("INSERT INTO quota_state (tenant, model, quota, period, period_start, used, quota_limit, mode, version) VALUES "
            "('acme','gpt-4o','monthly_tokens','month',toDateTime('2026-11-01 00:00:00','UTC'),2100,2000,'soft',1)")
    checks = {
        # a2 at the old price 0.00875, a3 once at the new price 0.007
        "SELECT toString(round(sum(cost), 9)) FROM usage_monthly WHERE tenant = 'acme' AND model = 'gpt-4o'": "0.01575",
        "SELECT toString(sum(requests)) FROM usage_monthly WHERE tenant = 'acme'": "3",
        "SELECT toString(sum(unpriced_requests)) FROM usage_daily WHERE tenant = 'acme'": "1",
        "SELECT toString(round(sum(cost), 9)) FROM usage_daily WHERE day = toDate('2026-11-15') AND model = 'gpt-4o'": "0.007",
        "SELECT toString(sum(overage)) FROM soft_quota_overage": "100",
        "SELECT toString(count()) FROM price_periods": "3",
        # 1000*3 + 2000*0.3 + 3000*3.75 + 4000*15 + 5000*20, per million
        "SELECT toString(round(sum(cost), 9)) FROM usage_monthly WHERE tenant = 'types' AND model = 'claude-x'": "0.17485",
        # the first gpt-4o price: 1000*2.5 + 2000*1.25 + 3000*2.5 + 4000*10 + 5000*10
        "SELECT toString(round(sum(cost), 9)) FROM usage_daily WHERE tenant = 'types' AND model = 'gpt-4o'": "0.1025",
        "SELECT toString(sum(cached_tokens)) || ' ' || toString(sum(cache_write_tokens)) || ' ' || toString(sum(reasoning_tokens)) "
        "|| ' ' || toString(sum(total_tokens)) FROM usage_monthly WHERE tenant = 'types'": "4000 6000 10000 30000",
        # a0 predates gpt-4o's first price: kept, unpriced (migration 045)
        "SELECT toString(count()) FROM usage_priced WHERE priced = 0": "2",
        "SELECT toString(count()) FROM usage_priced WHERE tenant NOT IN ('night', 'types')": "4",
        "SELECT toString(count()) || ' ' || toString(sum(total_tokens)) FROM usage_priced WHERE tenant = 'night'": "1 150",
        "SELECT toString(day) FROM usage_daily WHERE tenant = 'night'": "2026-11-30",
    }
    version = str(s.query("SELECT version()")).strip().strip('"')
    for q, want in checks.items():
        got = str(s.query(q, "TSVRaw")).strip()
        if got != want:
            print(f"chdb {version}: {q}\n  = {got!r}, want {want!r}", file=sys.stderr)
            return 1
    docs = (ROOT / "docs" / "finance.md").read_text()
    queries = re.findall(r"```sql\n(.*?)```", docs, re.S)
    for q in queries:
        try:
            s.query(q.strip().rstrip(";"))
        except Exception as e:  # chdb raises its own error types
            print(f"chdb {version}: docs/finance.md query failed: {e}\n{q}", file=sys.stderr)
            return 1
    print(f"chdb {version}: {len(checks)} view checks and {len(queries)} finance queries passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
