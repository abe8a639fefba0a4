//! Reading a pipeline file into toml's tables in one pass.
//!
//! toml's `DeTable::parse` lexes the text into tokens, parses the tokens into a vector of
//! events, then walks that vector to build its tables. On the 10,000-node pipeline of
//! `benches/bench.sh` the walk is two thirds of the parse and the event vector a fifth of its
//! memory (best of 50 in one process: 16 ms for the whole parse, 4.7 ms for the tokens and
//! events alone). Here the tables are built as toml's own parser reports each event, from the
//! same tokens, so the syntax accepted and the values decoded are toml's: 12 to 13 ms measured
//! the same way. The tokens are lexed a chunk at a time (see [`Chunks`]), and each array is
//! made at its size: on that pipeline, `kavi pipeline check` touched 61 MB before, 43 MB after,
//! and every page first touched is one the kernel must zero.
//!
//! Only the shapes pipeline files use are built here: `[table]` headers, keys (dotted ones
//! too), strings, numbers, booleans, dates, arrays and inline tables. On anything else (an
//! array of tables, a key or table defined twice, a header that reopens a table, a dotted key
//! inside an inline table) and on any error, [`parse`] gives `None` and the caller parses with
//! toml itself: what a file means, and how a mistake in it is reported, never depend on which
//! of the two read it. The tests compare both, spans included, on every TOML file in the
//! repository and on generated documents.
//!
//! On more than two cores, a document of megabytes is read in parts, one thread each, cut
//! before table headers, and the parts' tables joined as reading on would have joined them
//! (see [`parse`]). A pipeline's nodes are handed to the loader one by one as their tables
//! end ([`parse_taking`]), so that the tables of a long pipeline are never all held at once.
//!
//! [`Chunks`]: builder::Chunks

use std::borrow::Cow;

use toml::Spanned;
use toml::de::{DeTable, DeValue};

mod builder;
mod compare;
mod parts;

pub use compare::agrees_with_toml;
use parts::{cut_points, parse_part, parse_parts, parts_for, take_parts};

/// toml's limit on nested arrays and tables, and on the keys of one dotted key.
const DEPTH_LIMIT: u32 = 80;

/// A key as written, with where it is.
pub(super) type Key<'i> = Spanned<Cow<'i, str>>;

/// Tables by name, in the document's order: what a [`Taker`] may collect.
pub(super) type Tables<'i> = Vec<(Key<'i>, Spanned<DeValue<'i>>)>;

/// The document's tables exactly as `DeTable::parse(text)` gives them, or `None` when `text`
/// holds something this reader leaves to toml (see the module's doc).
///
/// A long document is read in parts, one thread each (see [`cut_points`]), and the parts'
/// tables joined as reading on would have joined them ([`merge`]). Where the parts do not
/// join, or one ends inside a string or an array, the document is read again whole: a cut
/// changes how fast a document is read, never what it means.
///
/// [`merge`]: parts::merge
pub(crate) fn parse(text: &str) -> Option<Spanned<DeTable<'_>>> {
    let cuts = cut_points(text, parts_for(text.len()));
    let root = if cuts.is_empty() {
        None
    } else {
        parse_parts(text, &cuts)
    }
    .or_else(|| parse_part(text, 0..text.len()))?;
    Some(Spanned::new(0..0, root))
}

/// What [`parse_taking`] hands over: the table of each `[PREFIX.NAME]` header, in the
/// document's order, as soon as the next header shows that no header adds to it. The tables
/// taken are dropped as they are used, so a long document is never held whole: on the
/// 10,000-node pipeline the nodes' tables are most of the memory its reading touches.
pub(crate) trait Taker<'i> {
    /// Takes `table`, named `name`; `root` is the document's tables so far (keys read before
    /// this header, and those after that are not headers). Giving the table back stops the
    /// taking: it and the tables after it stay in the tree.
    fn take(
        &mut self,
        root: &DeTable<'i>,
        name: Key<'i>,
        table: Spanned<DeValue<'i>>,
    ) -> Option<Spanned<DeValue<'i>>>;
}

/// A document read by [`parse_taking`].
pub(crate) enum Read<'i> {
    /// Its tables. Under the prefix, the first `handed` names stand for the tables handed
    /// over (each an empty table spanning its header): the taker keeps those and no others.
    Tables {
        root: Spanned<DeTable<'i>>,
        handed: usize,
    },
    /// What this reader leaves to toml (see [`parse`]).
    LeftToToml,
}

/// Reads `text` as [`parse`] does, handing each `[PREFIX.NAME]` table to `taker` as it ends.
/// Handing over stops (the rest staying in the tree) where a header adds to the table just
/// read, or where the prefix's table already held something; where a header reaches into a
/// table already handed over, or under one of the document-level keys in `reads` after a
/// table was handed over, the document is read again with nothing handed over. A document
/// read in parts hands over the tables of its first part, the one read on this thread.
pub(crate) fn parse_taking<'i>(
    text: &'i str,
    prefix: &str,
    reads: &[&str],
    taker: &mut dyn Taker<'i>,
) -> Read<'i> {
    let cuts = cut_points(text, parts_for(text.len()));
    match take_parts(text, &cuts, prefix, reads, taker) {
        Some((root, handed)) => Read::Tables {
            root: Spanned::new(0..0, root),
            handed,
        },
        None => match parse(text) {
            Some(root) => Read::Tables { root, handed: 0 },
            None => Read::LeftToToml,
        },
    }
}

#[cfg(test)]
mod tests;
