"""The functions SQL sent through the gateway may not call, and why: exact names, prefixes,
``current_setting`` of anything but harmless settings, and casts to catalog object types; and
the functions that name a relation in an argument, checked like a table name. A name is
matched on its last part, lower-cased; the lists err on the side of refusing."""

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
_CATALOG = (
    "it reveals the database's catalog (definitions, descriptions, sizes or privileges of "
    "objects, those the gateway hides included)"
)
_CONNECTION = (
    "it shows the connection's own state (prepared statements, cursors), the gateway's "
    "statements included"
)
_SQLITE_CONNECTION = (
    "it reads the connection's counters (row ids, changes), which the gateway's journal and "
    "other agents' writes share; use RETURNING"
)
_CATALOG_TYPES = (
    "casts to catalog object types are not allowed: they look names up in the system "
    "catalogs, those of objects the gateway hides included"
)

# Types whose values are catalog objects named by text (input) or shown by name (output).
# A cast to one runs the type's input or output function, a catalog lookup that would name and
# enumerate relations, types and roles the gateway hides, so it is refused as a call; their
# functions (regclass(text), regclassin, ...) and the to_reg* lookups are refused by name.
CATALOG_OBJECT_TYPES = frozenset(
    {
        "regclass",
        "regcollation",
        "regconfig",
        "regdictionary",
        "regnamespace",
        "regoper",
        "regoperator",
        "regproc",
        "regprocedure",
        "regrole",
        "regtype",
    }
)

# Functions that name a relation in an argument (regclass, or its name as text or its oid), by
# the positions of those arguments (0-based). PostgreSQL looks the name up in the catalog,
# hidden relations included, so the argument must be a string literal, which the analysis
# resolves like a table name in FROM (unknown_table when the gateway does not show it). The
# other functions of pg_proc taking a regclass are refused outright (sizes, privileges, index
# maintenance, table_to_xml, partitions, files: FORBIDDEN_FUNCTIONS and the prefixes below).
RELATION_ARGUMENTS: dict[str, tuple[int, ...]] = {
    "nextval": (0,),
    "currval": (0,),
    "setval": (0,),
    "row_security_active": (0,),
    "pg_relation_is_updatable": (0,),
    "pg_column_is_updatable": (0,),
    "pg_relation_is_publishable": (0,),
    "pg_index_has_property": (0,),
    "pg_index_column_has_property": (0,),
    "satisfies_hash_partition": (0,),
}

# Functions whose value is of a catalog object type (pg_typeof: regtype). Shown as text, the
# value names only the type of the agent's own expression; but PostgreSQL casts integers to
# these types implicitly (a UNION arm, CASE, COALESCE, an array, a comparison), which would
# name any object by oid. So they are allowed only as the operand of a cast to a text type.
CATALOG_TYPE_FUNCTIONS = frozenset({"pg_typeof", "get_current_ts_config"})
TEXT_TYPES = frozenset({"text", "varchar", "bpchar", "char", "name"})

# The txid_* functions are the older names of the pg_* ones: each is refused when its
# successor is (txid_status like pg_xact_status).
TXID_SUCCESSORS = {
    "txid_current": "pg_current_xact_id",
    "txid_current_if_assigned": "pg_current_xact_id_if_assigned",
    "txid_current_snapshot": "pg_current_snapshot",
    "txid_snapshot_xmin": "pg_snapshot_xmin",
    "txid_snapshot_xmax": "pg_snapshot_xmax",
    "txid_snapshot_xip": "pg_snapshot_xip",
    "txid_visible_in_snapshot": "pg_visible_in_snapshot",
    "txid_status": "pg_xact_status",
}

# Settings current_setting may read (lower case; names are case-insensitive): formatting,
# locale, version and the transaction's own state. Nothing that names a path, and no custom
# (dotted) setting: custom settings often hold secrets (app.jwt_secret, an extension's key),
# which a list of dangerous names would miss, as it would settings of later releases.
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
            "inet_server_addr",
            "inet_server_port",
            "inet_client_addr",
            "inet_client_port",
            "pg_postmaster_start_time",
            "pg_conf_load_time",
            "pg_walfile_name",
            "pg_walfile_name_offset",
            "pg_xact_status",
            "pg_xact_commit_timestamp",
            "pg_xact_commit_timestamp_origin",
            "pg_last_committed_xact",
            # the transactions in progress, other sessions' included
            "pg_current_snapshot",
            "pg_export_snapshot",
        ),
        _SERVER,
    ),
    **dict.fromkeys(("pg_prepared_statement", "pg_cursor"), _CONNECTION),
    **dict.fromkeys(("pg_nextoid", "pg_extension_config_dump"), _ADMIN),
    "pg_is_other_temp_schema": _CATALOG,
    **dict.fromkeys(
        (
            "pg_describe_object",
            "pg_identify_object",
            "pg_identify_object_as_address",
            "format_type",
            "pg_sequence_last_value",
            "pg_sequence_parameters",
            "pg_relation_size",
            "pg_total_relation_size",
            "pg_table_size",
            "pg_indexes_size",
            "pg_relation_filenode",
            "pg_filenode_relation",
            "pg_tablespace_databases",
            "has_any_column_privilege",
            "has_column_privilege",
            "has_database_privilege",
            "has_foreign_data_wrapper_privilege",
            "has_function_privilege",
            "has_language_privilege",
            "has_parameter_privilege",
            "has_schema_privilege",
            "has_sequence_privilege",
            "has_server_privilege",
            "has_table_privilege",
            "has_tablespace_privilege",
            "has_type_privilege",
            "has_largeobject_privilege",
            "pg_has_role",
            "obj_description",
            "col_description",
            "shobj_description",
        ),
        _CATALOG,
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
    # contrib modules that take any relation by name (regclass), hidden ones included:
    # pgstattuple, pgrowlocks, pg_prewarm, pg_visibility, amcheck, pg_freespacemap
    **dict.fromkeys(
        (
            "pgstattuple",
            "pgstattuple_approx",
            "pgstatindex",
            "pgstatginindex",
            "pgstathashindex",
            "pg_relpages",
            "pgrowlocks",
            "pg_prewarm",
            "pg_visibility",
            "pg_visibility_map",
            "pg_visibility_map_summary",
            "pg_check_frozen",
            "pg_check_visible",
            "bt_index_check",
            "bt_index_parent_check",
            "gin_index_check",
            "verify_heapam",
            "pg_freespace",
        ),
        "it reads a relation's storage named by a string, past the gateway's analysis",
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
    "pg_stat_get_": _SERVER,  # per-table, per-database and server-wide statistics
    "pg_current_wal_": _SERVER,
    "pg_stat_statements": _SERVER,  # every session's SQL
    "pg_last_wal_": _SERVER,
    # pg_get_viewdef, _ruledef, _triggerdef, _constraintdef, _functiondef, _indexdef, _expr,
    # _function_arguments, _serial_sequence, _userbyid, _object_address, ... (pg_get_keywords
    # is allowed, see _ALLOWED_FUNCTIONS)
    "pg_get_": _CATALOG,
    "pg_partition_": _CATALOG,  # pg_partition_tree, _ancestors, _root: names of relations
    "to_reg": _CATALOG,  # to_regclass, to_regtype, to_regproc, to_regrole, ...
    # the catalog object types' functions: regclass(text), regclassin, regroleout, ...
    # (regoper and regproc cover regoperator and regprocedure)
    **dict.fromkeys(sorted(CATALOG_OBJECT_TYPES - {"regoperator", "regprocedure"}), _CATALOG),
}

# Names a prefix above would refuse that are harmless: SQL's keyword list.
_ALLOWED_FUNCTIONS = frozenset({"pg_get_keywords"})

_SQLITE_FORBIDDEN = {
    **dict.fromkeys(
        ("load_extension", "readfile", "writefile", "edit", "fts3_tokenizer"),
        "it touches files or loads code on the database host",
    ),
    **dict.fromkeys(("changes", "total_changes", "last_insert_rowid"), _SQLITE_CONNECTION),
}

# pg_table_is_visible, pg_type_is_visible, ...: whether an object of any oid exists (NULL when
# not) and is on the search path, hidden relations included.
_VISIBLE_SUFFIX = "_is_visible"

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
    bare = TXID_SUCCESSORS.get(bare, bare) if dialect == "postgresql" else bare
    reason = FORBIDDEN_FUNCTIONS.get(bare)
    if reason is None and dialect == "postgresql" and bare.endswith(_VISIBLE_SUFFIX):
        reason = _CATALOG
    if bare == "current_setting" and first_literal is not None:
        if first_literal.lower() in READABLE_SETTINGS:
            return None
        return f"{reason}; not {first_literal!r}"
    if reason is None and dialect == "sqlite":
        reason = _SQLITE_FORBIDDEN.get(bare)
    if reason is None and bare not in _ALLOWED_FUNCTIONS:
        for prefix, why in FORBIDDEN_FUNCTION_PREFIXES.items():
            if bare.startswith(prefix):
                return why
    if reason is None and arity is not None and _SQL_TEXT_ARITY.get(bare) == arity:
        reason = _SQL_TEXT
    return reason


def call_form_reason(name: str, dialect: str = "postgresql", *, literal_args: bool) -> str | None:
    """Why a call of ``name`` in this form is refused, beyond :func:`forbidden_function_reason`.

    ``literal_args``: the call's relation arguments (:data:`RELATION_ARGUMENTS`) are string
    literals (False for field-selection syntax, ``('x'::text).nextval``, or an expression). A
    function of :data:`CATALOG_TYPE_FUNCTIONS` is refused here; the caller allows it under a
    cast to text. None when the form is allowed (or the rule does not apply).
    """
    if dialect != "postgresql":
        return None
    bare = name.rsplit(".", 1)[-1].lower()
    if bare in RELATION_ARGUMENTS and not literal_args:
        return (
            "it names a relation by its argument, which must be a string literal that the "
            f"gateway checks like a table name ({bare}('table_name')), not an expression"
        )
    if bare in CATALOG_TYPE_FUNCTIONS:
        return (
            "its value is of a catalog object type, to which PostgreSQL casts integers "
            "implicitly (naming any object by its oid, those the gateway hides included); it "
            f"is allowed only as the operand of a cast to text: {bare}(...)::text"
        )
    return None


def forbidden_type_reason(name: str, dialect: str = "postgresql") -> str | None:
    """Why a cast to (or a column of) type ``name`` is refused, or None when it is allowed.

    ``name`` is matched like a function's (last part, lower case); an array type (``_regclass``,
    or ``regclass[]`` whose name is ``regclass``) counts as its element type. Only PostgreSQL's
    catalog object types are refused (:data:`CATALOG_OBJECT_TYPES`), on PostgreSQL only.
    """
    if dialect != "postgresql":
        return None
    bare = name.rsplit(".", 1)[-1].lower()
    if bare.removeprefix("_") in CATALOG_OBJECT_TYPES:
        return _CATALOG_TYPES
    return None
