"""The tables several daemons share beside the store's: ``nodes`` (one row per daemon, its
lease in ``expires``) and ``leases`` (which daemon owns each agent, at which epoch)."""

from __future__ import annotations

from collections.abc import Mapping

from psycopg import sql

from corral.daemon.stores._postgres import qualified

# Taken (transaction-scoped) by a daemon joining and by an adoption: one at a time.
CLUSTER_LOCK_KEY = 0x636F7272616C6E  # "corraln"
# Held for the session: shared by every daemon with --node, exclusively by a daemon alone.
MODE_LOCK_KEY = 0x636F7272616C6D  # "corralm"

# A node is live while its lease runs and it has not left.
_LIVE = "(n.expires > clock_timestamp() AND NOT n.stopped)"


class ClusterSql:
    """Every statement of the cluster, with table names qualified by the store's schema."""

    def __init__(self, schema: str | None, store_tables: Mapping[str, sql.Identifier]) -> None:
        names = {
            "nodes": qualified(schema, "nodes"),
            "leases": qualified(schema, "leases"),
            # The store's own, as it names them.
            "agents": store_tables["agents"],
            "counter": store_tables["counter"],
        }

        def q(text: str) -> sql.Composed:
            return sql.SQL(text).format(**names)

        # NOTIFY channels are names of at most 63 bytes; the schema keeps stores apart.
        self.channel = ("corral_log" if not schema else f"corral_log.{schema}")[:63]
        self.listen = sql.SQL("LISTEN {}").format(sql.Identifier(self.channel))
        self.ddl = [
            q(
                "CREATE TABLE IF NOT EXISTS {nodes} (name text PRIMARY KEY, "
                "incarnation text NOT NULL, url text NOT NULL, token_hash text NOT NULL, "
                "started_at timestamptz NOT NULL, heartbeat timestamptz NOT NULL, "
                "expires timestamptz NOT NULL, stopped boolean NOT NULL DEFAULT false)"
            ),
            q(
                "CREATE TABLE IF NOT EXISTS {leases} (agent_id text PRIMARY KEY, "
                "node text NOT NULL, epoch bigint NOT NULL, run text NOT NULL)"
            ),
            q("CREATE INDEX IF NOT EXISTS leases_node ON {leases} (node)"),
            q("CREATE INDEX IF NOT EXISTS leases_run ON {leases} (run)"),
        ]
        self.nodes_seen = q(
            "SELECT name, token_hash, " + _LIVE.replace("n.", "") + ", "
            "EXTRACT(EPOCH FROM expires - clock_timestamp())::float8 FROM {nodes}"
        )
        self.join = q(
            "INSERT INTO {nodes} (name, incarnation, url, token_hash, started_at, heartbeat, "
            "expires, stopped) VALUES (%(name)s, %(inc)s, %(url)s, %(hash)s, "
            "clock_timestamp(), clock_timestamp(), "
            "clock_timestamp() + make_interval(secs => %(lease)s), false) "
            "ON CONFLICT (name) DO UPDATE SET incarnation = EXCLUDED.incarnation, "
            "url = EXCLUDED.url, token_hash = EXCLUDED.token_hash, "
            "started_at = EXCLUDED.started_at, heartbeat = EXCLUDED.heartbeat, "
            "expires = EXCLUDED.expires, stopped = false"
        )
        self.renew = q(
            "UPDATE {nodes} SET heartbeat = clock_timestamp(), "
            "expires = clock_timestamp() + make_interval(secs => %(lease)s) "
            "WHERE name = %(name)s AND incarnation = %(inc)s AND NOT stopped "
            "AND expires > clock_timestamp() RETURNING 1"
        )
        self.leave = q(
            "UPDATE {nodes} SET stopped = true, expires = clock_timestamp() "
            "WHERE name = %(name)s AND incarnation = %(inc)s"
        )
        # Serialises an adoption with every append of every daemon (they bump this row).
        self.lock_counter = q("SELECT last_seq FROM {counter} FOR UPDATE")
        self.claim_own = q(
            "UPDATE {leases} SET epoch = epoch + 1 WHERE node = %(name)s RETURNING agent_id, epoch"
        )
        # Agents stored before their store had daemons with --node: leased to nobody yet.
        self.lease_strays = q(
            "INSERT INTO {leases} (agent_id, node, epoch, run) "
            "SELECT a.id, '', 0, COALESCE(a.data->>'runId', a.id) FROM {agents} a "
            "WHERE NOT EXISTS (SELECT 1 FROM {leases} l WHERE l.agent_id = a.id) "
            "ON CONFLICT (agent_id) DO NOTHING"
        )
        self.live_count = q("SELECT count(*) FROM {nodes} n WHERE " + _LIVE)
        orphaned = "l.node NOT IN (SELECT n.name FROM {nodes} n WHERE " + _LIVE + ")"
        self.orphan_runs = q(
            "SELECT l.run FROM {leases} l WHERE " + orphaned + " GROUP BY l.run "
            "ORDER BY min(l.agent_id)"
        )
        self.adopt = q(
            "UPDATE {leases} l SET node = %(name)s, epoch = l.epoch + 1 "
            "WHERE l.run = ANY(%(runs)s) AND " + orphaned + " RETURNING l.agent_id, l.epoch"
        )
        self.leases_of = q(
            "SELECT l.agent_id, l.node, l.epoch, n.incarnation, COALESCE(" + _LIVE + ", false) "
            "FROM {leases} l LEFT JOIN {nodes} n ON n.name = l.node "
            "WHERE l.agent_id = ANY(%s)"
        )
        self.insert_lease = q(
            "INSERT INTO {leases} (agent_id, node, epoch, run) VALUES (%s, %s, 1, %s) "
            "ON CONFLICT (agent_id) DO UPDATE SET node = EXCLUDED.node, epoch = 1, "
            "run = EXCLUDED.run"
        )
        self.delete_lease = q("DELETE FROM {leases} WHERE agent_id = %s")
        self.notify = sql.SQL("SELECT pg_notify(%s, %s)")
        self.owner = q(
            "SELECT l.node, n.url, COALESCE(" + _LIVE + ", false), "
            "COALESCE(EXTRACT(EPOCH FROM n.expires - clock_timestamp())::float8, 0) "
            "FROM {leases} l LEFT JOIN {nodes} n ON n.name = l.node WHERE l.agent_id = %s"
        )
        # Live nodes by their live agents (ended agents weigh nothing), fewest first.
        self.load = q(
            "SELECT n.name, n.url, count(a.id) FROM {nodes} n "
            "LEFT JOIN {leases} l ON l.node = n.name "
            "LEFT JOIN {agents} a ON a.id = l.agent_id "
            "AND NOT (a.data->>'state' = ANY(%s)) "
            "WHERE " + _LIVE + " GROUP BY n.name, n.url ORDER BY count(a.id), n.name"
        )
        self.node_list = q(
            "SELECT n.name, n.url, n.started_at, n.heartbeat, " + _LIVE + ", n.stopped, "
            "EXTRACT(EPOCH FROM clock_timestamp() - n.heartbeat)::float8, "
            "COALESCE(array_agg(l.agent_id ORDER BY l.agent_id) "
            "FILTER (WHERE l.agent_id IS NOT NULL), '{{}}') "
            "FROM {nodes} n LEFT JOIN {leases} l ON l.node = n.name "
            "GROUP BY n.name ORDER BY n.name"
        )
