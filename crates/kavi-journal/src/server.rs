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
/// catalog's 32-bit numbers.
fn open_sql() -> String {
    format!(
        "(SELECT pg_current_xact_id_if_assigned()::xid,
                 (pg_snapshot_xmax(began)::text::bigint % 4294967296)::text::xid,
                 ARRAY(SELECT (x::text::bigint % 4294967296)::text FROM pg_snapshot_xip(began) AS x)
            FROM (SELECT current_setting('{BEGAN}')::pg_snapshot) AS b (began))
           AS open (ours, began_xmax, began_running)"
    )
}

/// Whether the catalog row made by transaction `version` was made by another transaction that
/// had not committed when the open one began (`age` counts back from now, across the numbers'
/// wrap-around). SQL over [`open_sql`]'s columns.
const CHANGED_MEANWHILE: &str = "(version IS DISTINCT FROM ours
     AND (age(version) <= age(began_xmax) OR version::text = ANY (began_running)))";

/// The entries the open transaction appended, still without their MAC, as (seq, hash, NULL);
/// then (NULL, NULL, n), n the functions in the ledger's schema changed while it was open.
fn entries_sql() -> String {
    format!(
        "SELECT seq, hash, NULL::bigint FROM journal
         WHERE seq >= NULLIF(current_setting('{FIRST_ENTRY}', true), '')::bigint
           AND mac IS NULL AND xmin = pg_current_xact_id_if_assigned()::xid
         UNION ALL
         SELECT NULL, NULL, count(*) FROM
           (SELECT p.xmin FROM pg_proc p
             WHERE p.pronamespace = current_schema()::regnamespace) AS f (version),
           {open}
         WHERE {CHANGED_MEANWHILE}
         ORDER BY 1",
        open = open_sql()
    )
}

/// Everything in the ledger's schema that could run in one of kavi's transactions: the
/// triggers on its tables (with the function each runs), the functions in its schema (the
/// SHA-256 of their text, and their settings), rules, and the functions other than the
/// server's own that a constraint, default or policy on its tables calls. Each row: what it is,
/// its name, the table, what it runs, and the transaction that made its catalog row.
const CODE_SQL: &str = "
    SELECT 'trigger', t.tgname::text, c.relname::text,
           CASE WHEN p.pronamespace = current_schema()::regnamespace THEN p.proname::text
                ELSE p.oid::regprocedure::text END,
           t.xmin
      FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid JOIN pg_proc p ON p.oid = t.tgfoid
     WHERE NOT t.tgisinternal AND c.relnamespace = current_schema()::regnamespace
    UNION ALL
    SELECT 'function', p.proname::text, '',
           encode(sha256(convert_to(p.prosrc, 'UTF8')), 'hex')
             || COALESCE(' ' || array_to_string(p.proconfig, ' '), ''),
           p.xmin
      FROM pg_proc p WHERE p.pronamespace = current_schema()::regnamespace
    UNION ALL
    SELECT 'rule', r.rulename::text, c.relname::text, '', r.xmin
      FROM pg_rewrite r JOIN pg_class c ON c.oid = r.ev_class
     WHERE r.rulename <> '_RETURN' AND c.relnamespace = current_schema()::regnamespace
    UNION ALL
    SELECT 'call', pg_describe_object(d.classid, d.objid, d.objsubid), '',
           p.oid::regprocedure::text, d.xmin
      FROM pg_depend d JOIN pg_proc p ON p.oid = d.refobjid
     WHERE d.refclassid = 'pg_proc'::regclass AND p.pronamespace <> 'pg_catalog'::regnamespace
       AND d.classid IN ('pg_constraint'::regclass, 'pg_attrdef'::regclass,
                         'pg_policy'::regclass)
       AND COALESCE(
             (SELECT conrelid FROM pg_constraint
               WHERE d.classid = 'pg_constraint'::regclass AND oid = d.objid),
             (SELECT adrelid FROM pg_attrdef
               WHERE d.classid = 'pg_attrdef'::regclass AND oid = d.objid),
             (SELECT polrelid FROM pg_policy
               WHERE d.classid = 'pg_policy'::regclass AND oid = d.objid))
           IN (SELECT oid FROM pg_class WHERE relnamespace = current_schema()::regnamespace)";

/// [`CODE_SQL`] as one digest; whether the open transaction changed any of it, and whether
/// another one did while it was open; and whether it has written at all (when not, nothing
/// else is looked at).
fn digest_sql() -> String {
    format!(
        "SELECT md5(COALESCE(string_agg(concat_ws(' ', kind, name, place, runs, version::text),
                                        E'\\n' ORDER BY kind, name, place, runs), '')),
                COALESCE(bool_or(version = ours), false),
                COALESCE(bool_or({CHANGED_MEANWHILE}), false),
                pg_current_xact_id_if_assigned() IS NOT NULL
         FROM ({CODE_SQL}) AS code (kind, name, place, runs, version), {open}
         WHERE pg_current_xact_id_if_assigned() IS NOT NULL",
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
            "SELECT kind, name, place, runs FROM ({CODE_SQL}) AS code (kind, name, place, runs, version)"
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
            "rule" => problems.push(format!("rule {name} on {place}")),
            "call" => problems.push(format!("{name} calls {runs}")),
            _ => {}
        }
    }
    Ok(problems)
}

/// Whether a journal function on the server is not the text this kavi makes (a ledger made
/// by an older kavi, whose triggers are made again).
pub(super) fn functions_differ(db: &Db) -> crate::Result<bool> {
    let functions = journal_functions(&tables(db)?);
    let live: Vec<(String, String)> = db
        .prepare(
            "SELECT proname::text, encode(sha256(convert_to(prosrc, 'UTF8')), 'hex')
               FROM pg_proc WHERE pronamespace = current_schema()::regnamespace",
        )?
        .query_map([], |row| Ok((row.get(0)?, row.get(1)?)))?
        .collect::<kavi_db::Result<_>>()?;
    Ok(live
        .iter()
        .any(|(name, text)| functions.get(name).is_some_and(|made| made != text)))
}
