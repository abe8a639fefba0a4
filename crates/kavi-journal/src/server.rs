//! A server's journal entries, MACed by kavi before each commit with a key the server never
//! holds.
//!
//! On SQLite the triggers call a function kavi registers on its own connection. A server runs
//! its triggers itself, and a key it held (as a session setting, once) could be read by anyone
//! who logs in to the database, from a trigger of their own firing in kavi's session. So the
//! triggers append each entry without its MAC, and kavi, before it commits, reads the entries
//! its transaction appended and MACs them ([`ServerSeal`]).
//!
//! kavi MACs what its transaction appended, so no code but kavi's may write in its
//! transactions. Before it MACs, it checks that the ledger's tables have no trigger, rule, or
//! constraint, default or policy calling a function, but the journal's own, that the journal's
//! functions are the ones it makes, and that none of that changed while the transaction was
//! open (a function swapped for a moment and put back).

use std::collections::HashMap;

use kavi_db::postgres::BEGAN;
use kavi_db::{Db, DbError, Sealer};
use kavi_foundation::hash::sha256_hex;

use super::keys::MacKey;
use super::tables::{Table, WRITER, WRITES, tables, writer_function_body};
use super::{FIRST_ENTRY, JournalError};

/// The open transaction's own number, and the snapshot kept as it began ([`BEGAN`]): the
/// `xmax` (transactions from it on had not started) and those still running then, in the
/// catalog's 32-bit numbers. Here and below every call names the server's own function, and
/// every comparison has operands of one type: a function or operator of the same name
/// elsewhere on the search path, a closer match for its arguments, would otherwise answer.
fn open_sql() -> String {
    format!(
        "(SELECT pg_catalog.pg_current_xact_id_if_assigned()::xid,
                 ((pg_catalog.pg_snapshot_xmax(began)::text::bigint % 4294967296)::text)::xid,
                 ARRAY(SELECT (x::text::bigint % 4294967296)::text
                         FROM pg_catalog.pg_snapshot_xip(began) AS x)
            FROM (SELECT pg_catalog.current_setting('{BEGAN}')::pg_snapshot) AS b (began))
           AS open (ours, began_xmax, began_running)"
    )
}

/// Whether the catalog row made by transaction `version` was made by another transaction that
/// had not committed when the open one began (`age` counts back from now, across the numbers'
/// wrap-around). SQL over [`open_sql`]'s columns.
const CHANGED_MEANWHILE: &str = "(version IS DISTINCT FROM ours
     AND (pg_catalog.age(version) <= pg_catalog.age(began_xmax)
          OR version::text = ANY (began_running)))";

/// A default kavi makes: a literal of one of the server's own types, as `pg_get_expr` prints it
/// (a type of someone else's would be printed with its schema, or under its own name).
const LITERAL: &str = "'^(''([^'']|'''')*''|-?[0-9]+(\\.[0-9]+)?|true|false|NULL)\
                       (::(text|bigint|integer|smallint|boolean|double precision|real|numeric))?$'";

/// The ledger's schema, as an `oid`.
const LEDGER_SCHEMA: &str = "(SELECT n.oid FROM pg_catalog.pg_namespace n
                               WHERE n.nspname = pg_catalog.current_schema())";

/// The entries the open transaction appended, still without their MAC, as (seq, hash, NULL);
/// then (NULL, NULL, n), n the functions in the ledger's schema changed while it was open.
fn entries_sql() -> String {
    format!(
        "SELECT seq, hash, NULL::bigint FROM journal
         WHERE seq >= NULLIF(pg_catalog.current_setting('{FIRST_ENTRY}', true), '')::bigint
           AND mac IS NULL AND xmin = pg_catalog.pg_current_xact_id_if_assigned()::xid
         UNION ALL
         SELECT NULL, NULL, pg_catalog.count(*) FROM
           (SELECT p.xmin FROM pg_catalog.pg_proc p
             WHERE p.pronamespace = {LEDGER_SCHEMA}) AS f (version),
           {open}
         WHERE {CHANGED_MEANWHILE}
         ORDER BY 1",
        open = open_sql()
    )
}

/// Everything in the ledger's schema that could run code in one of kavi's transactions, or
/// point kavi at tables other than its own. Each row: what it is, its name, the table, what it
/// runs, and the transaction that made its catalog row. Of what kavi makes, only triggers and
/// functions are expected (compared with kavi's by [`foreign_code`]); anything of the other
/// kinds is someone else's: a rule; a `CHECK` constraint; a default other than a constant (one
/// can run SQL text, `query_to_xml`, or cast to a domain whose check runs); an operator, or a
/// function named as one of the server's, in the schema (the search path kavi pins reaches
/// them); a row-security policy; a column of a domain type (its check runs); an index on an
/// expression, or one whose predicate calls a function or operator not the server's own; a
/// table that inherits a ledger table (kavi's statements reach its rows and its triggers); a
/// foreign key into a ledger table from a table elsewhere (its actions write there); a view,
/// foreign or partitioned table standing in the schema.
fn code_sql() -> String {
    format!(
        "WITH ns (oid) AS {LEDGER_SCHEMA},
              ledger (oid, relname) AS (SELECT c.oid, c.relname::text FROM pg_catalog.pg_class c
                                         WHERE c.relnamespace = (SELECT oid FROM ns))
         SELECT 'trigger', t.tgname::text, c.relname,
                CASE WHEN p.pronamespace = (SELECT oid FROM ns) THEN p.proname::text
                     ELSE p.oid::regprocedure::text END,
                t.xmin
           FROM pg_catalog.pg_trigger t JOIN ledger c ON c.oid = t.tgrelid
                JOIN pg_catalog.pg_proc p ON p.oid = t.tgfoid
          WHERE NOT t.tgisinternal
         UNION ALL
         SELECT 'function', p.proname::text, '',
                pg_catalog.encode(pg_catalog.sha256(pg_catalog.convert_to(p.prosrc, 'UTF8'::name)),
                                  'hex')
                  || COALESCE(' ' || pg_catalog.array_to_string(p.proconfig, ' '), ''),
                p.xmin
           FROM pg_catalog.pg_proc p WHERE p.pronamespace = (SELECT oid FROM ns)
         UNION ALL
         SELECT 'rule', r.rulename::text, c.relname, '', r.xmin
           FROM pg_catalog.pg_rewrite r JOIN ledger c ON c.oid = r.ev_class
          WHERE r.rulename <> '_RETURN'::name
         UNION ALL
         SELECT 'check', k.conname::text, c.relname, '', k.xmin
           FROM pg_catalog.pg_constraint k JOIN ledger c ON c.oid = k.conrelid
          WHERE k.contype = 'c'::\"char\"
         UNION ALL
         SELECT 'default', a.attname::text, c.relname, '', d.xmin
           FROM pg_catalog.pg_attrdef d JOIN ledger c ON c.oid = d.adrelid
                JOIN pg_catalog.pg_attribute a ON a.attrelid = d.adrelid AND a.attnum = d.adnum
          WHERE pg_catalog.pg_get_expr(d.adbin, d.adrelid) !~ {LITERAL}
         UNION ALL
         SELECT 'operator', o.oprname::text, '', '', o.xmin
           FROM pg_catalog.pg_operator o WHERE o.oprnamespace = (SELECT oid FROM ns)
         UNION ALL
         SELECT 'shadowing function', p.proname::text, '', '', p.xmin
           FROM pg_catalog.pg_proc p
          WHERE p.pronamespace = (SELECT oid FROM ns)
            AND EXISTS (SELECT 1 FROM pg_catalog.pg_proc b
                         WHERE b.proname = p.proname
                           AND b.pronamespace = 'pg_catalog'::regnamespace::oid)
         UNION ALL
         SELECT 'policy', y.polname::text, c.relname, '', y.xmin
           FROM pg_catalog.pg_policy y JOIN ledger c ON c.oid = y.polrelid
         UNION ALL
         SELECT 'domain', a.attname::text, c.relname, y.typname::text, y.xmin
           FROM pg_catalog.pg_attribute a JOIN ledger c ON c.oid = a.attrelid
                JOIN pg_catalog.pg_type y ON y.oid = a.atttypid
          WHERE y.typtype = 'd'::\"char\" AND a.attnum > 0 AND NOT a.attisdropped
         UNION ALL
         SELECT 'index', x.relname::text, c.relname, '', x.xmin
           FROM pg_catalog.pg_index i JOIN ledger c ON c.oid = i.indrelid
                JOIN pg_catalog.pg_class x ON x.oid = i.indexrelid
          WHERE i.indexprs IS NOT NULL
             OR EXISTS (SELECT 1 FROM pg_catalog.pg_depend d
                          LEFT JOIN pg_catalog.pg_proc f
                            ON d.refclassid = 'pg_catalog.pg_proc'::regclass::oid
                           AND f.oid = d.refobjid
                          LEFT JOIN pg_catalog.pg_operator o
                            ON d.refclassid = 'pg_catalog.pg_operator'::regclass::oid
                           AND o.oid = d.refobjid
                         WHERE d.classid = 'pg_catalog.pg_class'::regclass::oid
                           AND d.objid = i.indexrelid
                           AND COALESCE(f.pronamespace, o.oprnamespace)
                               <> 'pg_catalog'::regnamespace::oid)
         UNION ALL
         SELECT 'child', h.relname::text, c.relname, '', i.xmin
           FROM pg_catalog.pg_inherits i JOIN ledger c ON c.oid = i.inhparent
                JOIN pg_catalog.pg_class h ON h.oid = i.inhrelid
         UNION ALL
         SELECT 'reference', k.conname::text, c.relname, f.relname::text, k.xmin
           FROM pg_catalog.pg_constraint k JOIN ledger c ON c.oid = k.confrelid
                JOIN pg_catalog.pg_class f ON f.oid = k.conrelid
          WHERE k.contype = 'f'::\"char\" AND f.relnamespace <> (SELECT oid FROM ns)
         UNION ALL
         SELECT 'relation', c.relname, '', '', x.xmin
           FROM ledger c JOIN pg_catalog.pg_class x ON x.oid = c.oid
          WHERE x.relkind IN ('v'::\"char\", 'm'::\"char\", 'f'::\"char\", 'p'::\"char\")"
    )
}

/// [`code_sql`] as one digest; whether the open transaction changed any of it, and whether
/// another one did while it was open; and whether it has written at all (when not, nothing
/// else is looked at).
fn digest_sql() -> String {
    format!(
        "SELECT pg_catalog.md5(COALESCE(pg_catalog.string_agg(
                    kind || ' ' || name || ' ' || place || ' ' || runs || ' ' || version::text,
                    E'\\n' ORDER BY kind, name, place, runs), '')),
                COALESCE(pg_catalog.bool_or(version = ours), false),
                COALESCE(pg_catalog.bool_or({CHANGED_MEANWHILE}), false),
                pg_catalog.pg_current_xact_id_if_assigned() IS NOT NULL
         FROM ({code}) AS code (kind, name, place, runs, version), {open}
         WHERE pg_catalog.pg_current_xact_id_if_assigned() IS NOT NULL",
        code = code_sql(),
        open = open_sql()
    )
}

/// Seals each transaction of a connection to a server (see the module's documentation).
pub struct ServerSeal {
    key: &'static MacKey,
    /// The digest of the schema's code ([`digest_sql`]) when it was last checked and found to
    /// be kavi's alone.
    checked: Option<String>,
}

impl ServerSeal {
    pub fn new(key: &'static MacKey) -> Self {
        Self { key, checked: None }
    }

    /// Refuses a transaction in which code other than kavi's may have written.
    fn check_code(&mut self, db: &Db) -> kavi_db::Result<()> {
        let (now, mine, changed, wrote): (String, bool, bool, bool) =
            db.query_row(&digest_sql(), [], |row| {
                Ok((row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?))
            })?;
        if !wrote {
            return Ok(());
        }
        if changed {
            // Perhaps swapped for a moment while this transaction wrote, and put back.
            self.checked = None;
            return Err(changed_meanwhile());
        }
        if mine || self.checked.as_deref() != Some(now.as_str()) {
            let problems = foreign_code(db).map_err(into_db)?;
            self.checked = problems.is_empty().then_some(now);
            if !problems.is_empty() {
                return Err(DbError::Refused(format!(
                    "the ledger's schema on the server holds code kavi did not make, which could \
                     write in kavi's transactions: {}; nothing was recorded (remove it, then run \
                     `kavi ledger verify`)",
                    problems.join("; ")
                )));
            }
        }
        Ok(())
    }
}

impl Sealer for ServerSeal {
    fn seal(&mut self, db: &Db) -> kavi_db::Result<Option<String>> {
        // The schema's code, looked at before the journal's triggers fire and take its lock,
        // which other writers wait for.
        self.check_code(db)?;
        // The journal's triggers are deferred to the commit: they append now. A journal
        // function swapped since the look above would run here: it is looked for again.
        db.execute_batch("SET CONSTRAINTS ALL IMMEDIATE")?;
        let mut entries = Vec::new();
        let mut changed = 0;
        db.prepare(&entries_sql())?.for_each([], |row| {
            match row.get::<_, Option<i64>>(0)? {
                Some(seq) => entries.push((seq, row.get::<_, String>(1)?)),
                None => changed = row.get::<_, i64>(2)?,
            }
            Ok(true)
        })?;
        if changed > 0 {
            self.checked = None;
            return Err(changed_meanwhile());
        }
        if entries.is_empty() {
            return Ok(None);
        }
        // Numbers and hex only, written into the statements; sent with the commit.
        let updates: Vec<String> = entries
            .chunks(500)
            .map(|part| {
                let values: Vec<String> = part
                    .iter()
                    .map(|(seq, hash)| format!("({seq}, '{}')", self.key.mac(hash)))
                    .collect();
                format!(
                    "UPDATE journal SET mac = v.mac FROM (VALUES {}) AS v (seq, mac)
                     WHERE journal.seq = v.seq",
                    values.join(", ")
                )
            })
            .collect();
        Ok(Some(updates.join(";\n")))
    }
}

fn changed_meanwhile() -> DbError {
    DbError::Refused(
        "the journal's triggers or functions on the server changed while this transaction was \
         open; nothing of it was recorded (run the command again)"
            .to_owned(),
    )
}

fn into_db(error: JournalError) -> DbError {
    match error {
        JournalError::Db(e) => e,
        JournalError::Keys(why) => DbError::Refused(why),
    }
}

/// The journal's functions, by name, and the SHA-256 of the text kavi makes each with.
fn journal_functions(tables: &[Table]) -> HashMap<String, String> {
    let mut functions = HashMap::from([(
        WRITER.to_owned(),
        sha256_hex(writer_function_body().as_bytes()),
    )]);
    for table in tables {
        for op in ["insert", "update", "delete"] {
            functions.insert(
                table.trigger_name(op),
                sha256_hex(table.function_body(op).as_bytes()),
            );
        }
    }
    functions
}

/// What in the schema is not as kavi makes it, described; empty when nothing.
pub(super) fn foreign_code(db: &Db) -> crate::Result<Vec<String>> {
    let tables = tables(db)?;
    let functions = journal_functions(&tables);
    let mut triggers = HashMap::new();
    for table in &tables {
        for op in ["insert", "update", "delete"] {
            let name = table.trigger_name(op);
            triggers.insert((name.clone(), table.name.clone()), name);
        }
        triggers.insert(
            (table.trigger_name(WRITES), table.name.clone()),
            WRITER.to_owned(),
        );
    }
    let rows: Vec<(String, String, String, String)> = db
        .prepare(&format!(
            "SELECT kind, name, place, runs FROM ({}) AS code (kind, name, place, runs, version)",
            code_sql()
        ))?
        .query_map([], |row| {
            Ok((row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?))
        })?
        .collect::<kavi_db::Result<_>>()?;
    let mut problems = Vec::new();
    for (kind, name, place, runs) in rows {
        match kind.as_str() {
            "trigger" if triggers.get(&(name.clone(), place.clone())) != Some(&runs) => {
                problems.push(format!("trigger {name} on {place} (runs {runs})"));
            }
            "function" if functions.get(&name).is_some_and(|made| *made != runs) => {
                problems.push(format!("function {name}, not the text kavi makes"));
            }
            "function" | "trigger" => {}
            "domain" => problems.push(format!("column {name} of {place} of domain {runs}")),
            "reference" => problems.push(format!("{kind} {name} into {place} from {runs}")),
            "relation" => problems.push(format!("{name}, a view or a table kavi does not make")),
            "operator" | "shadowing function" => problems.push(format!("{kind} {name}")),
            _ => problems.push(format!("{kind} {name} on {place}")),
        }
    }
    Ok(problems)
}

/// Whether a journal function on the server is not the text this kavi makes (a ledger made
/// by an older kavi, whose triggers are made again).
pub(super) fn functions_differ(db: &Db) -> crate::Result<bool> {
    let functions = journal_functions(&tables(db)?);
    let live: Vec<(String, String)> = db
        .prepare(&format!(
            "SELECT p.proname::text,
                        pg_catalog.encode(pg_catalog.sha256(
                            pg_catalog.convert_to(p.prosrc, 'UTF8'::name)), 'hex')
                   FROM pg_catalog.pg_proc p WHERE p.pronamespace = {LEDGER_SCHEMA}"
        ))?
        .query_map([], |row| Ok((row.get(0)?, row.get(1)?)))?
        .collect::<kavi_db::Result<_>>()?;
    Ok(live
        .iter()
        .any(|(name, text)| functions.get(name).is_some_and(|made| made != text)))
}
