"""A database's schema as comparable data, read from PostgreSQL's catalogs: what each table, column,
constraint, index, view, function, trigger, domain and grant of the public schema is, by name. Two
databases built two ways hold the same schema exactly when their snapshots are equal."""

from __future__ import annotations

import asyncpg

# Each query yields (object, definition) pairs (a relation's grants with PostgreSQL's defaults spelled
# out: no ACL and the owner's default ACL grant the same); together they cover every kind of object the schema
# makes. Definitions come from PostgreSQL's own deparsers, so spacing in the source does not count,
# but a function body is compared as written (prosrc is kept verbatim).
_QUERIES = {
    "relation": """
        SELECT c.relname, c.relkind::text || ' ' || array_to_string(
                   coalesce(c.relacl,
                            acldefault((CASE c.relkind WHEN 'S' THEN 's' ELSE 'r' END)::"char", c.relowner)), ',')
          FROM pg_class c WHERE c.relnamespace = 'public'::regnamespace AND c.relname <> 'minion_migrations'
           AND c.relname NOT LIKE 'minion_migrations%'""",
    "column": """
        SELECT c.relname || '.' || a.attname,
               concat_ws(' ', a.attnum, format_type(a.atttypid, a.atttypmod),
                         CASE WHEN a.attnotnull THEN 'NOT NULL' END, pg_get_expr(d.adbin, d.adrelid),
                         nullif(a.attgenerated, ''))
          FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
          LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
         WHERE c.relnamespace = 'public'::regnamespace AND c.relkind IN ('r', 'v') AND a.attnum > 0
           AND NOT a.attisdropped AND c.relname <> 'minion_migrations'""",
    "constraint": """
        SELECT coalesce(c.relname, t.typname) || '.' || k.conname, pg_get_constraintdef(k.oid)
          FROM pg_constraint k LEFT JOIN pg_class c ON c.oid = k.conrelid LEFT JOIN pg_type t ON t.oid = k.contypid
         WHERE k.connamespace = 'public'::regnamespace AND coalesce(c.relname, '') <> 'minion_migrations'""",
    "index": """
        SELECT indexrelid::regclass::text, pg_get_indexdef(indexrelid)
          FROM pg_index i JOIN pg_class c ON c.oid = i.indrelid
         WHERE c.relnamespace = 'public'::regnamespace AND c.relname <> 'minion_migrations'""",
    "view": """
        SELECT c.relname, pg_get_viewdef(c.oid) FROM pg_class c
         WHERE c.relnamespace = 'public'::regnamespace AND c.relkind = 'v'""",
    "function": """
        SELECT p.oid::regprocedure::text, pg_get_functiondef(p.oid)
          FROM pg_proc p WHERE p.pronamespace = 'public'::regnamespace""",
    "trigger": """
        SELECT c.relname || '.' || t.tgname, pg_get_triggerdef(t.oid)
          FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
         WHERE c.relnamespace = 'public'::regnamespace AND NOT t.tgisinternal""",
    "domain": """
        SELECT t.typname, format_type(t.typbasetype, t.typtypmod) FROM pg_type t
         WHERE t.typnamespace = 'public'::regnamespace AND t.typtype = 'd'""",
    "setting": "SELECT key, CASE WHEN key = 'store_signing_key' THEN 'random' ELSE value END FROM minion_settings",
}


async def snapshot(conn: asyncpg.Connection) -> dict[str, str]:
    """'kind name' -> definition, for every object of the public schema but the migrator's ledger."""
    found: dict[str, str] = {}
    for kind, sql in _QUERIES.items():
        for name, definition in await conn.fetch(sql):
            found[f"{kind} {name}"] = definition
    return found


def differences(a: dict[str, str], b: dict[str, str]) -> list[str]:
    """What one snapshot holds that the other does not, or holds otherwise, one line per object."""
    lines = [f"only in the first: {k}" for k in sorted(a.keys() - b.keys())]
    lines += [f"only in the second: {k}" for k in sorted(b.keys() - a.keys())]
    lines += [f"differs: {k}\n  first:  {a[k][:400]}\n  second: {b[k][:400]}"
              for k in sorted(a.keys() & b.keys()) if a[k] != b[k]]
    return lines
