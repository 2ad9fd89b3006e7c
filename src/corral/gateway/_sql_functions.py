"""The functions SQL sent through the gateway may not call, and why.

A name is matched on its last part (``pg_catalog.PG_READ_FILE`` is ``pg_read_file``), lower-cased,
against :data:`FORBIDDEN_FUNCTIONS` (exact names) and :data:`FORBIDDEN_FUNCTION_PREFIXES`. A
user function that happens to share a forbidden name or prefix is refused too: the lists err
on the side of refusing. On SQLite targets the file and extension-loading functions of SQLite
and its shell are refused as well.

``current_setting`` is refused unless its first argument is a string literal naming one of
:data:`READABLE_SETTINGS`. Settings name server paths (``data_directory``, ``config_file``,
``hba_file``, ...), and custom settings (``app.jwt_secret``, an extension's key) often hold
secrets; a list of dangerous names would miss those, and settings added by later releases,
so only settings known to be harmless may be read.
"""

from __future__ import annotations

_FILES = "it touches files on the database server"
_LARGE_OBJECTS = "it uses large objects (files inside the database server)"
_SERVERS = "it reaches other servers"
_ADMIN = "it administers the database server or its sessions"
_SQL_TEXT = "it runs SQL given as a string, past the gateway's analysis"
_STORAGE = "it modifies table storage directly"
_INDEXES = "it maintains an index, a change that persists even in a read-only transaction"
_SESSION = "it changes session state that outlives the request"
_XIDS = "it assigns a transaction id, which a read must not consume"
_SERVER = "it exposes the database server's configuration, files or other sessions"

# Settings current_setting may read (lower case; names are case-insensitive): formatting,
# locale, version and the transaction's own state. Nothing that names a path, and no custom
# (dotted) setting.
READABLE_SETTINGS = frozenset(
    {
        "application_name",
        "bytea_output",
        "client_encoding",
        "datestyle",
        "default_transaction_isolation",
        "default_transaction_read_only",
        "extra_float_digits",
        "integer_datetimes",
        "intervalstyle",
        "lc_monetary",
        "lc_numeric",
        "lc_time",
        "lock_timeout",
        "max_identifier_length",
        "search_path",
        "server_encoding",
        "server_version",
        "server_version_num",
        "standard_conforming_strings",
        "statement_timeout",
        "timezone",
        "transaction_isolation",
        "transaction_read_only",
    }
)
_SETTINGS = (
    "it reads server settings, which name server paths and may hold secrets; only these may "
    f"be read, named by a string literal: {', '.join(sorted(READABLE_SETTINGS))}"
)

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
            "gin_clean_pending_list",
            "brin_summarize_new_values",
            "brin_summarize_range",
            "brin_desummarize_range",
        ),
        _INDEXES,
    ),
    **dict.fromkeys(("set_limit", "setseed"), _SESSION),
    # txid_current_if_assigned and pg_current_xact_id_if_assigned never assign one: allowed.
    **dict.fromkeys(("txid_current", "pg_current_xact_id"), _XIDS),
    **dict.fromkeys(
        (
            "pg_stat_get_activity",
            "pg_stat_get_progress_info",
            "pg_stat_get_wal_senders",
            "pg_stat_get_wal_receiver",
            "pg_stat_get_subscription",
            "pg_lock_status",
            "pg_blocking_pids",
            "pg_safe_snapshot_blocking_pids",
            "pg_prepared_xact",
            "pg_get_replication_slots",
            "pg_get_backend_memory_contexts",
            "pg_get_shmem_allocations",
            "pg_hba_file_rules",
            "pg_ident_file_mappings",
            "pg_show_all_file_settings",
            "pg_show_all_settings",
            "pg_config",
            "pg_database_size",
            "pg_tablespace_size",
            "pg_tablespace_location",
            "pg_relation_filepath",
        ),
        _SERVER,
    ),
    "current_setting": _SETTINGS,
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
    # pageinspect: the raw pages of any table, the gateway's own and the system's included
    **dict.fromkeys(
        ("get_raw_page", "bt_page_items", "bt_page_stats", "bt_multi_page_stats", "bt_metap"),
        "it reads a relation's pages named by a string, past the gateway's analysis",
    ),
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
    "pg_stat_get_backend_": _SERVER,  # other sessions' queries, users, addresses
    "pg_control_": _SERVER,  # pg_control_checkpoint, _system, _init, _recovery
}

_SQLITE_FORBIDDEN = dict.fromkeys(
    ("load_extension", "readfile", "writefile", "edit", "fts3_tokenizer"),
    "it touches files or loads code on the database host",
)

# Functions that run SQL text only with this many arguments: ts_rewrite(query, select_text).
_SQL_TEXT_ARITY = {"ts_rewrite": 2}


def forbidden_function_reason(
    name: str,
    dialect: str = "postgresql",
    arity: int | None = None,
    first_literal: str | None = None,
) -> str | None:
    """Why a call of ``name`` (schema-qualified or not) is refused, or None when it is allowed.

    ``arity``, when known, refines the few functions that are only dangerous in one form;
    ``first_literal`` is the call's first argument when it is a string literal (None when it
    is not, or unknown): ``current_setting`` of a readable setting is allowed.
    """
    bare = name.rsplit(".", 1)[-1].lower()
    reason = FORBIDDEN_FUNCTIONS.get(bare)
    if bare == "current_setting" and first_literal is not None:
        if first_literal.lower() in READABLE_SETTINGS:
            return None
        return f"{reason}; not {first_literal!r}"
    if reason is None and dialect == "sqlite":
        reason = _SQLITE_FORBIDDEN.get(bare)
    if reason is None:
        for prefix, why in FORBIDDEN_FUNCTION_PREFIXES.items():
            if bare.startswith(prefix):
                return why
    if reason is None and arity is not None and _SQL_TEXT_ARITY.get(bare) == arity:
        reason = _SQL_TEXT
    return reason
