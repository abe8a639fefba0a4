//! Values crossing into and out of the database: what binds to a parameter ([`ToSql`],
//! [`Params`]), a row as it is read ([`Row`], [`ValueRef`]) and what a column reads as
//! ([`FromSql`]).

use crate::{DbError, Result, Value};

/// What can be bound to a parameter.
pub trait ToSql {
    fn to_sql(&self) -> Value;
}

impl ToSql for Value {
    fn to_sql(&self) -> Value {
        self.clone()
    }
}

impl ToSql for str {
    fn to_sql(&self) -> Value {
        Value::Text(self.to_owned())
    }
}

impl ToSql for String {
    fn to_sql(&self) -> Value {
        Value::Text(self.clone())
    }
}

impl ToSql for [u8] {
    fn to_sql(&self) -> Value {
        Value::Blob(self.to_vec())
    }
}

impl ToSql for Vec<u8> {
    fn to_sql(&self) -> Value {
        Value::Blob(self.clone())
    }
}

impl ToSql for bool {
    fn to_sql(&self) -> Value {
        Value::Integer(i64::from(*self))
    }
}

impl ToSql for f64 {
    fn to_sql(&self) -> Value {
        Value::Real(*self)
    }
}

macro_rules! integer_to_sql {
    ($($t:ty),*) => {$(
        impl ToSql for $t {
            fn to_sql(&self) -> Value {
                Value::Integer(i64::try_from(*self).unwrap_or(i64::MAX))
            }
        }
    )*};
}
integer_to_sql!(i32, i64, u32, u64, usize);

impl<T: ToSql + ?Sized> ToSql for &T {
    fn to_sql(&self) -> Value {
        (**self).to_sql()
    }
}

impl<T: ToSql> ToSql for Option<T> {
    fn to_sql(&self) -> Value {
        self.as_ref().map_or(Value::Null, ToSql::to_sql)
    }
}

/// The parameters of one query: `params![a, b]`.
#[macro_export]
macro_rules! params {
    () => { &[] as &[&dyn $crate::ToSql] };
    ($($param:expr),+ $(,)?) => { &[$(&$param as &dyn $crate::ToSql),+] as &[&dyn $crate::ToSql] };
}

/// One value of a row, borrowed from wherever the row is: a SQLite row is read where SQLite
/// keeps it, without a copy of each column first. Text read as bytes is its exact bytes.
#[derive(Clone, Copy)]
pub enum ValueRef<'a> {
    Null,
    Integer(i64),
    Real(f64),
    Text(&'a [u8]),
    Blob(&'a [u8]),
}

impl ValueRef<'_> {
    /// The value, owned; text that is not UTF-8 is read lossily, as it always was.
    pub fn to_owned_value(self) -> Value {
        match self {
            ValueRef::Null => Value::Null,
            ValueRef::Integer(n) => Value::Integer(n),
            ValueRef::Real(x) => Value::Real(x),
            ValueRef::Text(text) => Value::Text(String::from_utf8_lossy(text).into_owned()),
            ValueRef::Blob(bytes) => Value::Blob(bytes.to_vec()),
        }
    }
}

impl std::fmt::Debug for ValueRef<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.to_owned_value().fmt(f)
    }
}

impl Value {
    fn as_value_ref(&self) -> ValueRef<'_> {
        match self {
            Value::Null => ValueRef::Null,
            Value::Integer(n) => ValueRef::Integer(*n),
            Value::Real(x) => ValueRef::Real(*x),
            Value::Text(text) => ValueRef::Text(text.as_bytes()),
            Value::Blob(bytes) => ValueRef::Blob(bytes),
        }
    }
}

impl<'a> From<rusqlite::types::ValueRef<'a>> for ValueRef<'a> {
    fn from(value: rusqlite::types::ValueRef<'a>) -> Self {
        match value {
            rusqlite::types::ValueRef::Null => ValueRef::Null,
            rusqlite::types::ValueRef::Integer(n) => ValueRef::Integer(n),
            rusqlite::types::ValueRef::Real(x) => ValueRef::Real(x),
            rusqlite::types::ValueRef::Text(text) => ValueRef::Text(text),
            rusqlite::types::ValueRef::Blob(bytes) => ValueRef::Blob(bytes),
        }
    }
}

/// What a column can be read as.
pub trait FromSql: Sized {
    fn from_sql(value: ValueRef<'_>) -> Result<Self, String>;
}

impl FromSql for Value {
    fn from_sql(value: ValueRef<'_>) -> Result<Self, String> {
        Ok(value.to_owned_value())
    }
}

impl FromSql for String {
    fn from_sql(value: ValueRef<'_>) -> Result<Self, String> {
        match value {
            ValueRef::Text(text) => Ok(String::from_utf8_lossy(text).into_owned()),
            other => Err(format!("expected text, found {other:?}")),
        }
    }
}

impl FromSql for Vec<u8> {
    fn from_sql(value: ValueRef<'_>) -> Result<Self, String> {
        match value {
            ValueRef::Blob(bytes) | ValueRef::Text(bytes) => Ok(bytes.to_vec()),
            other => Err(format!("expected bytes, found {other:?}")),
        }
    }
}

impl FromSql for i64 {
    fn from_sql(value: ValueRef<'_>) -> Result<Self, String> {
        match value {
            ValueRef::Integer(n) => Ok(n),
            other => Err(format!("expected an integer, found {other:?}")),
        }
    }
}

impl FromSql for f64 {
    fn from_sql(value: ValueRef<'_>) -> Result<Self, String> {
        match value {
            ValueRef::Real(x) => Ok(x),
            // Exact below 2^53, which is all a ledger counts.
            #[allow(clippy::cast_precision_loss)]
            ValueRef::Integer(n) => Ok(n as f64),
            other => Err(format!("expected a number, found {other:?}")),
        }
    }
}

impl FromSql for bool {
    fn from_sql(value: ValueRef<'_>) -> Result<Self, String> {
        i64::from_sql(value).map(|n| n != 0)
    }
}

macro_rules! integer_from_sql {
    ($($t:ty),*) => {$(
        impl FromSql for $t {
            fn from_sql(value: ValueRef<'_>) -> Result<Self, String> {
                let n = i64::from_sql(value)?;
                <$t>::try_from(n).map_err(|_| format!("{n} is out of range"))
            }
        }
    )*};
}
integer_from_sql!(i32, u32, u64, usize);

impl<T: FromSql> FromSql for Option<T> {
    fn from_sql(value: ValueRef<'_>) -> Result<Self, String> {
        match value {
            ValueRef::Null => Ok(None),
            value => T::from_sql(value).map(Some),
        }
    }
}

/// How a column is named: by its position (only, so that a literal `0` is one).
pub trait ColumnIndex {
    fn index(self) -> usize;
}

impl ColumnIndex for usize {
    fn index(self) -> usize {
        self
    }
}

/// One row of a result, read where it is: a server's, as it came whole; a SQLite row, where
/// SQLite holds it while it is read.
pub struct Row<'a> {
    cells: Cells<'a>,
}

enum Cells<'a> {
    Owned(&'a [Value]),
    Sqlite(&'a rusqlite::Row<'a>),
}

impl std::fmt::Debug for Row<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Row")
            .field("values", &self.values())
            .finish()
    }
}

impl<'a> Row<'a> {
    /// A row that came whole.
    pub fn new(values: &'a [Value]) -> Self {
        Row {
            cells: Cells::Owned(values),
        }
    }

    /// A SQLite row, read in place.
    pub(crate) fn from_sqlite(row: &'a rusqlite::Row<'a>) -> Self {
        Row {
            cells: Cells::Sqlite(row),
        }
    }

    /// Every column, owned.
    pub fn values(&self) -> Vec<Value> {
        match &self.cells {
            Cells::Owned(values) => values.to_vec(),
            Cells::Sqlite(row) => (0..row.as_ref().column_count())
                .map_while(|i| row.get_ref(i).ok())
                .map(|value| ValueRef::from(value).to_owned_value())
                .collect(),
        }
    }

    fn cell(&self, column: usize) -> Option<ValueRef<'_>> {
        match &self.cells {
            Cells::Owned(values) => values.get(column).map(Value::as_value_ref),
            Cells::Sqlite(row) => row.get_ref(column).ok().map(ValueRef::from),
        }
    }

    /// Column `column` as a `T`; `row.get::<_, T>(i)` names the type.
    pub fn get<I: ColumnIndex, T: FromSql>(&self, column: I) -> Result<T> {
        let column = column.index();
        let value = self.cell(column).ok_or_else(|| DbError::Conversion {
            column,
            message: "no such column".into(),
        })?;
        T::from_sql(value).map_err(|message| DbError::Conversion { column, message })
    }

    /// Reads a column with `parse`, reporting its failure as the column's.
    pub fn parse<T, E: std::fmt::Display>(
        &self,
        column: usize,
        parse: impl FnOnce(String) -> Result<T, E>,
    ) -> Result<T> {
        parse(self.get(column)?).map_err(|e| DbError::Conversion {
            column,
            message: e.to_string(),
        })
    }
}

impl rusqlite::ToSql for Value {
    fn to_sql(&self) -> rusqlite::Result<rusqlite::types::ToSqlOutput<'_>> {
        use rusqlite::types::ToSqlOutput;
        Ok(match self {
            Value::Null => ToSqlOutput::Owned(rusqlite::types::Value::Null),
            Value::Integer(n) => ToSqlOutput::Owned(rusqlite::types::Value::Integer(*n)),
            Value::Real(x) => ToSqlOutput::Owned(rusqlite::types::Value::Real(*x)),
            Value::Text(text) => {
                ToSqlOutput::Borrowed(rusqlite::types::ValueRef::Text(text.as_bytes()))
            }
            Value::Blob(bytes) => ToSqlOutput::Borrowed(rusqlite::types::ValueRef::Blob(bytes)),
        })
    }
}

/// The parameters of a query: `params![a, b]`, an array of one type (`[run_id]`), or `[]`.
pub trait Params {
    fn values(self) -> Vec<Value>;
}

impl Params for &[&dyn ToSql] {
    fn values(self) -> Vec<Value> {
        self.iter().map(|p| p.to_sql()).collect()
    }
}

impl Params for [&dyn ToSql; 0] {
    fn values(self) -> Vec<Value> {
        Vec::new()
    }
}

macro_rules! array_params {
    ($($n:literal)*) => {$(
        impl<T: ToSql> Params for [T; $n] {
            fn values(self) -> Vec<Value> {
                self.iter().map(ToSql::to_sql).collect()
            }
        }
    )*};
}
array_params!(1 2 3 4 5 6 7 8);

/// `None` for a query that returned no rows, as for `SELECT ... WHERE` that matched nothing.
pub trait OptionalExtension<T> {
    fn optional(self) -> Result<Option<T>>;
}

impl<T> OptionalExtension<T> for Result<T> {
    fn optional(self) -> Result<Option<T>> {
        match self {
            Ok(value) => Ok(Some(value)),
            Err(DbError::NoRows) => Ok(None),
            Err(e) => Err(e),
        }
    }
}
