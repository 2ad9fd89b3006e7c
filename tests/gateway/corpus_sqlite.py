"""SQL corpora for SQLite targets, over the shop of :mod:`tests.gateway.corpus`.

- ``SQLITE_ESCAPES``: requests that try to write, leave read-only, reach files or other
  databases, or see what the gateway keeps for itself, through what is sent as a read.
  ``expect`` is the ``GatewayError`` code analysis refuses it with, ``"write"`` (analysis
  classifies it as a write: it needs an idempotency key, and a read-only execution of it
  fails as ``read_only_violation``) or ``"harmless"`` (it runs as the read it really is).
- ``SQLITE_VALID_READS``: analytical reads that must all pass, with their parameters (``$n``
  placeholders, as on PostgreSQL, unless the entry is about SQLite's own ``?``) and the
  catalog tables each one reads.
"""

from __future__ import annotations

import re
from typing import Any, NamedTuple

from tests.gateway.corpus import Read, _read

__all__ = ["SQLITE_ESCAPES", "SQLITE_VALID_READS", "SqliteEscape", "sqlite_text"]

JOURNAL = "corral_gateway_journal"


class SqliteEscape(NamedTuple):
    sql: str
    expect: str  # a GatewayError code, "write" or "harmless"
    note: str
    params: tuple[Any, ...] = ()


_E = SqliteEscape

SQLITE_ESCAPES: tuple[SqliteEscape, ...] = (
    # several statements, however hidden
    _E("SELECT 1; DROP TABLE orders", "multiple_statements", "plain"),
    _E("SELECT ';' AS x; DELETE FROM orders", "multiple_statements", "semicolon in a string"),
    _E('SELECT 1 AS "a;b"; DELETE FROM orders', "multiple_statements", "in a quoted name"),
    _E("SELECT 1 AS [a;b]; DELETE FROM orders", "multiple_statements", "in a bracketed name"),
    _E("SELECT 1 /* ; */; DROP TABLE orders", "multiple_statements", "semicolon in a comment"),
    _E("SELECT 1 -- harmless\n; DELETE FROM orders", "multiple_statements", "line comment"),
    _E("SELECT x'3b'; DELETE FROM orders", "multiple_statements", "a blob of ';'"),
    _E("SELECT 1; ATTACH DATABASE 'evil.db' AS evil", "multiple_statements", "trailing ATTACH"),
    _E(
        "COMMIT; INSERT INTO customers (id, name, email, country, created_at) "
        "VALUES (99, 'x', 'x@x', 'FR', 't')",
        "multiple_statements",
        "end the read, then write",
    ),
    _E(
        "CREATE TRIGGER t AFTER INSERT ON orders BEGIN DELETE FROM customers; END",
        "multiple_statements",
        "a trigger body holds statements",
    ),
    # transaction control and connection state
    _E("BEGIN IMMEDIATE", "forbidden_statement", "take the write lock"),
    _E("COMMIT", "forbidden_statement", "transaction control"),
    _E("ROLLBACK", "forbidden_statement", "transaction control"),
    _E("SAVEPOINT s1", "forbidden_statement", "savepoint"),
    _E("RELEASE s1", "forbidden_statement", "savepoint"),
    _E("PRAGMA query_only = OFF", "forbidden_statement", "leave read-only"),
    _E("PRAGMA writable_schema = ON", "forbidden_statement", "write the schema table"),
    _E("pragma journal_mode=delete", "forbidden_statement", "lower case"),
    _E("/* hi */ PRAGMA foreign_keys = OFF", "forbidden_statement", "behind a comment"),
    _E("EXPLAIN PRAGMA writable_schema = ON", "forbidden_statement", "pragmas act as compiled"),
    _E("EXPLAIN QUERY PLAN ATTACH 'x.db' AS x", "forbidden_statement", "explain of ATTACH"),
    # files and other databases
    _E("ATTACH DATABASE 'evil.db' AS evil", "forbidden_statement", "create a file"),
    _E("ATTACH 'file:evil.db?mode=rwc' AS e", "forbidden_statement", "URI filename"),
    _E("DETACH DATABASE main", "forbidden_statement", "detach"),
    _E("VACUUM INTO 'copy.db'", "forbidden_statement", "copy the database to a file"),
    _E("VACUUM INTO (SELECT 'copy.db')", "forbidden_statement", "file name from a subquery"),
    _E("VACUUM", "forbidden_statement", "rewrite the file"),
    _E("SELECT load_extension('/tmp/evil.so')", "forbidden_function", "load code"),
    _E("SELECT LOAD_EXTENSION('x', 'entry')", "forbidden_function", "upper case, two args"),
    _E("SELECT \"load_extension\"('x')", "forbidden_function", "quoted function name"),
    _E(
        "SELECT * FROM orders WHERE id = (SELECT load_extension('x'))",
        "forbidden_function",
        "in a scalar subquery",
    ),
    _E(
        "WITH x AS (SELECT load_extension('x') AS v) SELECT v FROM x",
        "forbidden_function",
        "in a CTE",
    ),
    _E("SELECT readfile('/etc/passwd')", "forbidden_function", "shell's file reader"),
    _E("SELECT writefile('/tmp/x', 'data')", "forbidden_function", "shell's file writer"),
    _E("SELECT edit('x')", "forbidden_function", "shell's editor"),
    _E("SELECT fts3_tokenizer('simple')", "forbidden_function", "tokenizer pointer"),
    # DDL
    _E("CREATE TABLE evil (x)", "forbidden_statement", "DDL"),
    _E("CREATE TEMP TABLE t AS SELECT * FROM customers", "forbidden_statement", "temp copy"),
    _E("CREATE VIEW v AS SELECT 1", "forbidden_statement", "view"),
    _E("CREATE VIRTUAL TABLE v USING fts5(x)", "forbidden_statement", "virtual table"),
    _E("DROP TABLE orders", "forbidden_statement", "DDL"),
    _E("ALTER TABLE orders RENAME TO o2", "forbidden_statement", "DDL"),
    _E("REINDEX", "forbidden_statement", "maintenance"),
    _E("ANALYZE", "forbidden_statement", "writes sqlite_stat1"),
    # what SQLite and the gateway keep for themselves
    _E("SELECT sql FROM sqlite_master", "unknown_table", "the schema, journal included"),
    _E("SeLeCt * FrOm SQLITE_SCHEMA", "unknown_table", "schema table, case"),
    _E('SELECT * FROM "sqlite_master"', "unknown_table", "quoted schema table"),
    _E("SELECT * FROM temp.sqlite_master", "unknown_table", "temp schema"),
    _E("SELECT count(*) FROM sqlite_master", "unknown_table", "no column named"),
    _E(
        "SELECT count(*) AS n FROM orders WHERE id IN (SELECT rowid FROM sqlite_master)",
        "unknown_table",
        "only the rowid: counts the schema's objects",
    ),
    _E(
        "SELECT id FROM orders WHERE id IN (SELECT rowid FROM main.sqlite_master)",
        "unknown_table",
        "rowids, schema-qualified",
    ),
    _E("SELECT name FROM pragma_table_list", "unknown_table", "table-valued pragma"),
    _E("SELECT file FROM pragma_database_list", "unknown_table", "file paths"),
    _E(f"SELECT * FROM pragma_table_info('{JOURNAL}')", "unknown_table", "journal's columns"),
    _E("SELECT * FROM dbstat", "unknown_table", "page statistics, every table"),
    _E("SELECT sql FROM sqlite_stmt", "unknown_table", "other agents' statements"),
    _E(f"SELECT * FROM {JOURNAL}", "unknown_table", "the journal"),
    _E(f"SELECT * FROM main.[{JOURNAL}]", "unknown_table", "the journal, bracketed"),
    _E(
        f"INSERT INTO {JOURNAL} VALUES ('a', 'k', 'f', 'completed', '{{}}', 't', 't')",
        "unknown_table",
        "forge a replay",
    ),
    _E(f"DELETE FROM {JOURNAL}", "unknown_table", "forget every key"),
    _E(
        "WITH x AS (SELECT name FROM sqlite_master) SELECT * FROM x",
        "unknown_table",
        "hidden in a CTE",
    ),
    _E(
        "SELECT (SELECT group_concat(name) FROM sqlite_master) AS names",
        "unknown_table",
        "in a scalar subquery",
    ),
    _E(
        "SELECT id, status, 1, 1, 1, 1 FROM orders UNION ALL "
        "SELECT rootpage, sql, 1, 1, 1, 1 FROM sqlite_master",
        "unknown_table",
        "in a UNION arm",
    ),
    _E(
        "SELECT value FROM json_each((SELECT json_group_array(sql) FROM sqlite_master))",
        "unknown_table",
        "fed to json_each",
    ),
    _E("UPDATE sqlite_master SET sql = 'x'", "parse_error", "SQLite refuses it itself"),
    # writes, however dressed
    _E("WITH x AS (SELECT 1) DELETE FROM orders", "write", "CTE before a DELETE"),
    _E(
        "REPLACE INTO customers (id, name, email, country, created_at) "
        "VALUES (1, 'x', 'x@x', 'FR', 't')",
        "write",
        "REPLACE deletes, then inserts",
    ),
    _E("INSERT INTO orders SELECT * FROM orders WHERE 0", "write", "INSERT ... SELECT"),
    _E("UPDATE orders SET status = 'x' RETURNING id", "write", "RETURNING looks like a read"),
    _E(
        "INSERT INTO orders (id, customer_id, status, total, created_at) "
        "VALUES (1, 1, 'x', 1, 't') ON CONFLICT (id) DO UPDATE SET status = 'y'",
        "write",
        "upsert",
    ),
    _E("INSERT INTO orders DEFAULT VALUES", "write", "no values at all"),
    _E(
        "WITH d AS (DELETE FROM orders RETURNING id) SELECT * FROM d",
        "parse_error",
        "no writable CTEs in SQLite",
    ),
    _E("SELECT * FROM (DELETE FROM orders RETURNING *)", "parse_error", "DELETE as a table"),
    # comment and quoting tricks
    _E('SELECT "x"";DROP TABLE orders" FROM orders', "unknown_column", "quote inside a name"),
    _E("SELECT `a``;` FROM orders", "unknown_column", "doubled back-quote"),
    _E("SELECT [;DROP TABLE orders] FROM orders", "unknown_column", "bracket name"),
    _E("\ufeffPRAGMA query_only = 0", "forbidden_statement", "byte-order mark before PRAGMA"),
    _E("\ufeffVACUUM", "forbidden_statement", "byte-order mark before VACUUM"),
    _E(
        "SELECT count(*) FROM sqlite_master WHERE EXISTS "
        "(WITH sqlite_master AS (SELECT 1) SELECT 1 FROM sqlite_master)",
        "unknown_table",
        "a CTE named like the table it hides",
    ),
    _E(
        f"WITH {JOURNAL} AS (SELECT 1 AS a) SELECT count(*) FROM {JOURNAL}",
        "unknown_table",
        "a CTE named like the journal",
    ),
    _E("SELECT rowid FROM sqlite_master", "unknown_table", "rowids of the schema table"),
    _E("SELECT :cmd", "invalid_operation", "a named placeholder"),
    _E("SELECT 1 /* unterminated ; DROP TABLE orders", "harmless", "comment runs to the end"),
    _E("SELECT 1 --\nAS vacuum", "harmless", "a keyword as an alias"),
    _E("SELECT '1'';DROP TABLE orders;--' AS s", "harmless", "doubled quote in a string"),
    _E("SELECT $1 AS s", "harmless", "SQL in a parameter", ("'; DROP TABLE orders; --",)),
    # the connection's counters, shared with the journal and other agents' writes
    _E("SELECT changes()", "forbidden_function", "rows changed by the last write"),
    _E("SELECT total_changes()", "forbidden_function", "every agent's changes"),
    _E("SELECT last_insert_rowid()", "forbidden_function", "the journal's last row id"),
    _E(
        "UPDATE orders SET total = last_insert_rowid() WHERE id = 1",
        "forbidden_function",
        "the journal's last row id, read in a write",
    ),
    _E(
        "UPDATE orders SET total = total_changes() WHERE id = 1",
        "forbidden_function",
        "other agents' changes, read in a write",
    ),
    _E("SELECT Changes()", "forbidden_function", "the counters, in any case"),
    _E("SELECT sqlite_version(), sqlite_source_id()", "harmless", "version"),
    _E("EXPLAIN DELETE FROM orders", "harmless", "EXPLAIN compiles, never runs"),
    _E(
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 100000) "
        "SELECT count(*) FROM n",
        "harmless",
        "a long loop, bounded by the timeout",
    ),
    # statements that crashed the PostgreSQL parser or analysis: SQLite's limits hold
    _E("SELECT 1" + "+1" * 100_000, "statement_too_complex", "200 KB operator chain"),
    _E("SELECT 1" + "+1" * 2_000, "statement_too_complex", "2,000-term operator chain"),
    _E("SELECT " + "(SELECT " * 200 + "1" + ")" * 200, "statement_too_complex", "subqueries"),
    _E("SELECT " + "(" * 12_000 + "1" + ")" * 12_000, "statement_too_complex", "parens"),
)

_PLACEHOLDER = re.compile(r"\$(\d+)")


def sqlite_text(sql: str) -> str:
    """``sql`` with ``$n`` placeholders written as SQLite's ``?n`` (corpus text only:
    ``$`` appears nowhere else outside strings in it)."""
    return _PLACEHOLDER.sub(r"?\1", sql)


SQLITE_VALID_READS: tuple[Read, ...] = (
    _read("SELECT id, name FROM customers WHERE country = $1", "customers", params=("FR",)),
    _read(
        "SELECT o.id, c.name, o.total FROM orders o "
        "JOIN customers c ON c.id = o.customer_id WHERE o.status = 'paid'",
        "orders",
        "customers",
    ),
    _read(
        "SELECT customer_id, id, total, sum(total) OVER (PARTITION BY customer_id "
        "ORDER BY created_at ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS running "
        "FROM orders",
        "orders",
    ),
    _read(
        "SELECT * FROM (SELECT p.*, rank() OVER w AS r, lag(price) OVER w AS prev "
        "FROM products p WINDOW w AS (PARTITION BY category ORDER BY price DESC)) AS ranked "
        "WHERE r <= 2 AND ranked.category <> 'office'",
        "products",
    ),
    _read(
        "SELECT id, row_number() OVER (ORDER BY total DESC) AS rn, ntile(3) OVER "
        "(ORDER BY total) AS third, percent_rank() OVER (ORDER BY total) AS pr, "
        "cume_dist() OVER (ORDER BY total) AS cd FROM orders",
        "orders",
    ),
    _read(
        "SELECT DISTINCT customer_id, first_value(id) OVER w AS first_order, "
        "last_value(id) OVER w AS last_order, nth_value(id, 2) OVER w AS second_order "
        "FROM orders WINDOW w AS (PARTITION BY customer_id ORDER BY created_at "
        "RANGE BETWEEN UNBOUNDED PRECEDING AND UNBOUNDED FOLLOWING)",
        "orders",
    ),
    _read(
        "SELECT count(*) FILTER (WHERE status = 'paid') AS paid, "
        "sum(total) FILTER (WHERE status <> 'paid') AS other FROM orders",
        "orders",
    ),
    _read(
        "SELECT customer_id, count(*) AS n, sum(total) AS spent FROM orders "
        "GROUP BY customer_id HAVING count(*) > $1 ORDER BY spent DESC",
        "orders",
        params=(1,),
    ),
    _read(
        "WITH paid AS (SELECT customer_id, total FROM orders WHERE status = 'paid') "
        "SELECT c.name, sum(p.total) AS paid_total FROM paid p "
        "JOIN customers c ON c.id = p.customer_id GROUP BY c.name ORDER BY c.name",
        "orders",
        "customers",
    ),
    _read(
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 10) "
        "SELECT i, i * i AS square FROM n",
    ),
    _read(
        "WITH RECURSIVE chain(id, depth) AS (SELECT id, 1 FROM orders WHERE id = 1 "
        "UNION ALL SELECT o.id, c.depth + 1 FROM orders o JOIN chain c ON o.id = c.id + 1 "
        "WHERE c.depth < 5) SELECT * FROM chain",
        "orders",
    ),
    _read(
        "SELECT id, json_extract(meta, '$.channel') AS channel FROM orders "
        "WHERE json_extract(meta, '$.gift') = 1",
        "orders",
    ),
    _read(
        "SELECT id, meta ->> '$.coupon.code' AS coupon, meta -> '$.coupon' AS raw "
        "FROM orders WHERE meta IS NOT NULL",
        "orders",
    ),
    _read(
        "SELECT p.sku, j.value AS size FROM products p, json_each(p.attrs, '$.sizes') AS j "
        "ORDER BY p.sku, j.value",
        "products",
    ),
    _read(
        "SELECT t.fullkey, t.type FROM products p, json_tree(p.attrs) AS t "
        "WHERE p.id = $1 ORDER BY t.fullkey",
        "products",
        params=(1,),
    ),
    _read(
        "SELECT category, json_group_array(sku) AS skus, "
        "json_group_object(sku, price) AS prices FROM products GROUP BY category",
        "products",
    ),
    _read(
        "SELECT country, group_concat(name, ', ') AS names FROM customers "
        "GROUP BY country ORDER BY country",
        "customers",
    ),
    _read(
        "SELECT c.name, (SELECT count(*) FROM orders o WHERE o.customer_id = c.id) AS orders "
        "FROM customers c",
        "customers",
        "orders",
    ),
    _read(
        "SELECT name FROM customers c WHERE EXISTS "
        "(SELECT 1 FROM orders o WHERE o.customer_id = c.id AND o.status = 'open')",
        "customers",
        "orders",
    ),
    _read(
        "SELECT sku FROM products WHERE id IN (SELECT product_id FROM order_items "
        "WHERE quantity >= $1)",
        "products",
        "order_items",
        params=(2,),
    ),
    _read(
        "SELECT name FROM customers c WHERE NOT EXISTS "
        "(SELECT 1 FROM orders o WHERE o.customer_id = c.id)",
        "customers",
        "orders",
    ),
    _read(
        "SELECT c.name, coalesce(sum(o.total), 0) AS spent FROM customers c "
        "LEFT JOIN orders o ON o.customer_id = c.id GROUP BY c.id, c.name",
        "customers",
        "orders",
    ),
    _read(
        "SELECT customer_id, name, revenue FROM customer_revenue WHERE revenue > $1",
        "customer_revenue",
        params=(50,),
    ),
    _read(
        "SELECT customer_id FROM orders WHERE status = 'paid' INTERSECT "
        "SELECT customer_id FROM orders WHERE status = 'shipped' "
        "UNION SELECT id FROM customers WHERE country = 'NO' EXCEPT SELECT 99",
        "orders",
        "customers",
    ),
    _read(
        "SELECT id, CASE WHEN total >= 50 THEN 'large' WHEN total >= 20 THEN 'medium' "
        "ELSE 'small' END AS size, iif(meta IS NULL, 'none', 'some') AS has_meta FROM orders",
        "orders",
    ),
    _read(
        "SELECT strftime('%Y-%m', created_at) AS month, count(*) AS n, "
        "date(min(created_at)) AS first_day FROM orders GROUP BY month ORDER BY month",
        "orders",
    ),
    _read(
        "SELECT upper(name) AS shout, substr(email, instr(email, '@') + 1) AS domain, "
        "replace(name, ' ', '_') AS slug, printf('%05.1f', length(name)) AS len FROM customers "
        "WHERE email LIKE '%.com' OR name GLOB 'E*'",
        "customers",
    ),
    _read(
        "SELECT round(avg(price), 2) AS mean, abs(min(price) - max(price)) AS spread, "
        "sqrt(sum(price)) AS root, power(2, 3) AS eight, total(price) AS t FROM products",
        "products",
    ),
    _read(
        "SELECT cast(total AS integer) AS whole, typeof(total) AS t, nullif(status, 'paid') AS s, "
        "ifnull(meta, '{}') AS m FROM orders",
        "orders",
    ),
    _read(
        "SELECT id, total FROM orders ORDER BY total DESC, id LIMIT $1 OFFSET $2",
        "orders",
        params=(3, 2),
    ),
    _read("VALUES (1, 'a'), (2, 'b'), (3, 'c')"),
    _read('SELECT "name", "country" FROM "customers" WHERE "id" = $1', "customers", params=(1,)),
    _read(
        "SELECT [sku], `name` FROM [products] WHERE [category] = ?", "products", params=("books",)
    ),
    _read(
        "SELECT id FROM orders WHERE customer_id = ?1 OR customer_id = ?2 ORDER BY id",
        "orders",
        params=(1, 5),
    ),
    _read(
        "SELECT s.customer_id, s.n FROM (SELECT customer_id, count(*) AS n FROM orders "
        "GROUP BY customer_id) AS s WHERE s.n >= 2",
        "orders",
    ),
    _read(
        "SELECT count(DISTINCT customer_id) AS buyers, min(total) AS low, max(total) AS high "
        "FROM orders",
        "orders",
    ),
    _read(
        "SELECT name FROM customers ORDER BY name COLLATE NOCASE DESC",
        "customers",
    ),
    _read(
        "SELECT sku, json_array_length(attrs, '$.sizes') AS sizes, json_valid(attrs) AS ok "
        "FROM products",
        "products",
    ),
    _read(
        "SELECT oi.order_id, p.name, oi.quantity * oi.unit_price AS line FROM order_items oi "
        "JOIN products p ON p.id = oi.product_id JOIN orders o ON o.id = oi.order_id "
        "WHERE o.status IN ('paid', 'shipped') ORDER BY oi.order_id, p.name",
        "order_items",
        "products",
        "orders",
    ),
    _read(
        "SELECT name, sum(quantity) OVER (ORDER BY product_id GROUPS BETWEEN 1 PRECEDING "
        "AND CURRENT ROW) AS nearby FROM order_items JOIN products ON products.id = product_id",
        "order_items",
        "products",
    ),
    _read("EXPLAIN QUERY PLAN SELECT * FROM orders WHERE customer_id = $1", "orders", params=(1,)),
)
