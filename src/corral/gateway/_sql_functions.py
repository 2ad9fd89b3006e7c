"""The functions SQL sent through the gateway may not call, and why.

A name is matched on its last part (``pg_catalog.PG_READ_FILE`` is ``pg_read_file``), lower-cased,
against :data:`FORBIDDEN_FUNCTIONS` (exact names) and :data:`FORBIDDEN_FUNCTION_PREFIXES`. A
user function that happens to share a forbidden name or prefix is refused too: the lists err
on the side of refusing. On SQLite targets the file and extension-loading functions of SQLite
and its shell are refused as well.
"""

from __future__ import annotations

_FILES = "it touches files on the database server"
_LARGE_OBJECTS = "it uses large objects (files inside the database server)"
_SERVERS = "it reaches other servers"
_ADMIN = "it administers the database server or its sessions"
_SQL_TEXT = "it runs SQL given as a string, past the gateway's analysis"
_STORAGE = "it modifies table storage directly"

# exact name -> why
FORBIDDEN_FUNCTIONS: dict[str, str] = {
    **dict.fromkeys(
        (
            "pg_read_file",
            "pg_read_binary_file",
            "pg_stat_file",
            "pg_current_logfile",
            "pg_logdir_ls",
        ),
        _FILES,
    ),
    **dict.fromkeys(("loread", "lowrite"), _LARGE_OBJECTS),
    "http": _SERVERS,
    **dict.fromkeys(
        (
            "pg_terminate_backend",
            "pg_cancel_backend",
            "pg_reload_conf",
            "pg_rotate_logfile",
            "pg_rotate_logfile_old",
            "pg_switch_wal",
            "pg_switch_xlog",
            "set_config",
            "pg_promote",
            "pg_backup_start",
            "pg_backup_stop",
            "pg_start_backup",
            "pg_stop_backup",
            "pg_wal_replay_pause",
            "pg_wal_replay_resume",
            "pg_log_backend_memory_contexts",
            "pg_import_system_collations",
            "pg_notify",
            "pg_drop_replication_slot",
            "pg_replication_slot_advance",
            "pg_logical_emit_message",
            "pg_sync_replication_slots",
            "pg_stat_statements_reset",
        ),
        _ADMIN,
    ),
    **dict.fromkeys(
        (
            "query_to_xml",
            "query_to_xmlschema",
            "query_to_xml_and_xmlschema",
            "ts_stat",
            "connectby",
            "xpath_table",
        ),
        _SQL_TEXT,
    ),
    "pg_truncate_visibility_map": _STORAGE,
}

# prefix -> why
FORBIDDEN_FUNCTION_PREFIXES: dict[str, str] = {
    "pg_read_": _FILES,
    "pg_ls_": _FILES,
    "pg_file_": _FILES,  # adminpack: pg_file_write, pg_file_rename, pg_file_unlink, ...
    "pg_get_wal_": "it reads the server's WAL files",
    "lo_": _LARGE_OBJECTS,
    "dblink": _SERVERS,
    "http_": _SERVERS,
    "pg_background": _SQL_TEXT,
    "crosstab": _SQL_TEXT,
    "cursor_to_xml": _SQL_TEXT,
    "query_to_xml": _SQL_TEXT,
    "database_to_xml": "it reads every table, past the gateway's analysis",
    "schema_to_xml": "it reads every table of a schema, past the gateway's analysis",
    "table_to_xml": "it reads a table named by a string, past the gateway's analysis",
    "pg_advisory": "it takes advisory locks that outlive the request",
    "pg_try_advisory": "it takes advisory locks that outlive the request",
    "pg_sleep": "it holds a connection doing nothing",
    "pg_stat_reset": _ADMIN,
    "pg_create_": _ADMIN,
    "pg_copy_": _ADMIN,
    "pg_logical_slot_": _ADMIN,
    "pg_replication_origin": _ADMIN,
    "heap_force_": _STORAGE,
}

_SQLITE_FORBIDDEN = dict.fromkeys(
    ("load_extension", "readfile", "writefile", "edit", "fts3_tokenizer"),
    "it touches files or loads code on the database host",
)

# Functions that run SQL text only with this many arguments: ts_rewrite(query, select_text).
_SQL_TEXT_ARITY = {"ts_rewrite": 2}


def forbidden_function_reason(
    name: str, dialect: str = "postgresql", arity: int | None = None
) -> str | None:
    """Why a call of ``name`` (schema-qualified or not) is refused, or None when it is allowed.

    ``arity``, when known, refines the few functions that are only dangerous in one form.
    """
    bare = name.rsplit(".", 1)[-1].lower()
    reason = FORBIDDEN_FUNCTIONS.get(bare)
    if reason is None and dialect == "sqlite":
        reason = _SQLITE_FORBIDDEN.get(bare)
    if reason is None:
        for prefix, why in FORBIDDEN_FUNCTION_PREFIXES.items():
            if bare.startswith(prefix):
                return why
    if reason is None and arity is not None and _SQL_TEXT_ARITY.get(bare) == arity:
        reason = _SQL_TEXT
    return reason
