//! Copying a SQLite ledger to a PostgreSQL server (`kavi ledger migrate --to`): every row of
//! every table as it is, the journal and the signed checkpoints included, so that the copy's
//! chain is the original's and verifies as it did. The artifacts' files go with them, as the
//! server keeps file content for every machine (or to the object store, when there is one).

use super::db::{Backend, Db};
use super::{Artifact, ArtifactStore, LedgerError, Result, journal};
use kavi_db::postgres;

/// Rows copied, per table.
pub type Copied = Vec<(String, usize)>;

impl super::Ledger {
    /// Copies this ledger, a SQLite file, into the empty database at `url`, in one transaction,
    /// with the content of its file artifacts from `store`.
    pub fn copy_to_postgres(&self, url: &str, store: &ArtifactStore) -> Result<Copied> {
        if self.conn.backend() != Backend::Sqlite {
            return Err(LedgerError::CopyRefused(
                "the ledger to copy is on a server already; copy from a SQLite ledger".into(),
            ));
        }
        let mut target = super::connection::connect_postgres(url)?;
        if super::migrations::postgres_schema_exists(&target)? {
            return Err(LedgerError::CopyRefused(format!(
                "{} holds a ledger already: copy into an empty database",
                postgres::redacted(url)
            )));
        }
        super::migrations::migrate_postgres(&mut target, url)?;
        let tx = target.transaction()?;
        // The journal is copied as it is: the triggers would write it again, with new entries.
        journal::drop_triggers(&tx)?;
        let mut copied = Vec::new();
        for (table, _) in kavi_db::ddl::tables_in_order(&super::migrations::sqlite_schema()?) {
            if table == "schema_version" {
                continue;
            }
            copied.push((table.clone(), copy_table(&self.conn, &tx, &table)?));
        }
        // Those an object store keeps already are found where their copied rows say.
        let files: Vec<Artifact> = self
            .conn
            .prepare(
                "SELECT sha256, kind, size, path FROM artifacts
                 WHERE path != '' AND sha256 NOT IN (SELECT sha256 FROM artifact_objects)",
            )?
            .query_map([], |row| {
                let path: String = row.get(3)?;
                Ok(Artifact {
                    sha256: row.get(0)?,
                    kind: row.get(1)?,
                    size: row.get(2)?,
                    file: Some(store.path_of_sha256(&row.get::<_, String>(0)?)),
                    path,
                    inline: None,
                    location: None,
                    sent_to: None,
                })
            })?
            .collect::<super::db::Result<_>>()?;
        for mut artifact in files {
            store.send(&mut artifact)?;
            super::artifacts::share(&tx, &artifact)?;
        }
        // Identities go on from the largest copied value.
        let identities: Vec<(String, String)> = tx
            .prepare(
                "SELECT table_name::text, column_name::text FROM information_schema.columns
                 WHERE table_schema = current_schema() AND is_identity = 'YES'",
            )?
            .query_map([], |row| Ok((row.get(0)?, row.get(1)?)))?
            .collect::<super::db::Result<_>>()?;
        for (table, column) in identities {
            tx.execute_batch(&format!(
                "SELECT setval(pg_get_serial_sequence('\"{table}\"', '{column}'),
                               COALESCE((SELECT MAX(\"{column}\") FROM \"{table}\"), 0) + 1, false)"
            ))?;
        }
        journal::install(&tx)?;
        tx.commit()?;
        Ok(copied)
    }
}

/// Copies one table's rows, in the order SQLite keeps them, its rowid too where the server's
/// table has one (journal entries name such rows by it).
fn copy_table(source: &Db, target: &Db, table: &str) -> Result<usize> {
    let columns: Vec<String> = source
        .prepare(&format!(
            "SELECT name FROM pragma_table_info('{table}') ORDER BY cid"
        ))?
        .query_map([], |row| row.get(0))?
        .collect::<super::db::Result<_>>()?;
    let with_rowid = target.query_row(
        "SELECT count(*) FROM information_schema.columns
         WHERE table_schema = current_schema() AND table_name = ?1 AND column_name = 'rowid'",
        [table],
        |row| row.get::<_, i64>(0),
    )? > 0;
    let mut names: Vec<String> = columns.iter().map(|c| format!("\"{c}\"")).collect();
    if with_rowid {
        names.insert(0, "rowid".to_owned());
    }
    let list = names.join(", ");
    let placeholders: Vec<String> = (1..=names.len()).map(|i| format!("?{i}")).collect();
    let insert = format!(
        "INSERT INTO \"{table}\" ({list}) VALUES ({})",
        placeholders.join(", ")
    );
    let order = if with_rowid { "rowid" } else { "1" };
    let mut count = 0;
    let mut failure = None;
    source
        .prepare(&format!("SELECT {list} FROM \"{table}\" ORDER BY {order}"))?
        .for_each([], |row| {
            let owned = row.values();
            let values: Vec<&dyn super::db::ToSql> =
                owned.iter().map(|v| v as &dyn super::db::ToSql).collect();
            match target.execute(&insert, values.as_slice()) {
                Ok(_) => {
                    count += 1;
                    Ok(true)
                }
                Err(e) => {
                    failure = Some(e);
                    Ok(false)
                }
            }
        })?;
    match failure {
        Some(e) => Err(e.into()),
        None => Ok(count),
    }
}
