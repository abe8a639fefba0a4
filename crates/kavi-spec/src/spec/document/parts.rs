//! Reading a long document in parts, one thread each, cut before table headers, and joining
//! the parts' tables as reading on would have joined them.

use std::ops::Range;

use toml::Spanned;
use toml::de::{DeTable, DeValue};
use toml::map::Entry;
use toml_parser::parser::{RecursionGuard, ValidateWhitespace};
use toml_parser::{ParseError, Source};

use super::builder::{Builder, Chunks, Taking, TakingState};
use super::{DEPTH_LIMIT, Taker};

/// Reads the parts `cuts` make, the first handing its `[PREFIX.NAME]` tables over: the
/// tables and how many were handed over, or `None` when a part does not parse, the reading
/// was spoiled, or the parts do not join.
pub(super) fn take_parts<'i>(
    text: &'i str,
    cuts: &[usize],
    prefix: &str,
    reads: &[&str],
    taker: &mut dyn Taker<'i>,
) -> Option<(DeTable<'i>, usize)> {
    let mut take = |part| take_part(text, part, prefix, reads, taker);
    if cuts.is_empty() {
        return take(0..text.len());
    }
    let joins = |root: &DeTable<'i>, later: &DeTable<'i>, handed: &usize| {
        *handed == 0 || !reaches_into_taken(root, later, prefix, reads, text)
    };
    read_parts(text, cuts, take, joins)
}

/// Reads `text[part]` handing its `[PREFIX.NAME]` tables over: the part's tables and how many
/// were handed over, or `None` when the part does not parse or its reading was spoiled.
fn take_part<'i>(
    text: &'i str,
    part: Range<usize>,
    prefix: &str,
    reads: &[&str],
    taker: &mut dyn Taker<'i>,
) -> Option<(DeTable<'i>, usize)> {
    let mut builder = Builder::new(text, part.start);
    builder.taking = Some(Taking {
        prefix,
        reads,
        taker,
        held: None,
        handed: 0,
        state: TakingState::Taking,
    });
    read_with(text, part, builder, |mut builder| {
        let ended = builder.end();
        let taking = builder.taking.take()?;
        (ended && taking.state != TakingState::Spoiled).then_some((builder.root, taking.handed))
    })
    .flatten()
}

/// Whether a later part reaches into what the first one handed over: a header under a name
/// the prefix's table already has (a table the later part made on a header's path there), or
/// a document-level key the taker read.
fn reaches_into_taken(
    root: &DeTable<'_>,
    later: &DeTable<'_>,
    prefix: &str,
    reads: &[&str],
    text: &str,
) -> bool {
    later.iter().any(|(key, value)| {
        let key = key.get_ref().as_ref();
        if reads.contains(&key) {
            return true;
        }
        let (Some(DeValue::Table(named)), DeValue::Table(later_named)) =
            (root.get(key).map(Spanned::get_ref), value.get_ref())
        else {
            return false;
        };
        key == prefix
            && later_named.iter().any(|(name, value)| {
                made_on_path(value, text) && named.contains_key(name.get_ref().as_ref())
            })
    })
}

/// A part is at least this long. Below it a second thread costs more than it saves here: on
/// the 10,000-node pipeline of `benches/bench.sh` (830 KB), read in two parts on two cores,
/// `check` took 34.9 -> 36.9 ms and 36.5 -> 46.4 ms of CPU, the second thread's fresh memory
/// and the joining dearer than the half it read; on the 100,000-node one (8.7 MB) 347 -> 306
/// ms (`perf stat -r 8`). Tests cut every document they can.
pub(super) const PART_BYTES: usize = if cfg!(test) { 16 } else { 1024 * 1024 };

/// At most this many parts (and threads).
const MAX_PARTS: usize = 8;

/// How many parts a document of `len` bytes is read in: one per core but the one the nodes
/// are loaded on while the first part is read (see `spec::load`), each at least
/// [`PART_BYTES`]. On two cores, one part: the 100,000-node pipeline read straight through
/// while its nodes load took 207 ms for `check`, against 240 ms in two parts beside the
/// loading thread (medians of 16, in turn).
pub(super) fn parts_for(len: usize) -> usize {
    if len < 2 * PART_BYTES {
        return 1;
    }
    (crate::config::cores() - 1)
        .min(len / PART_BYTES)
        .clamp(1, MAX_PARTS)
}

/// Where to cut `text` into `parts` parts of about the same length: each cut just before a `[`
/// that opens a line, the first such after an even share. That `[` opens a table header, or
/// else it is inside a multi-line string or array, and the part before it ends inside that
/// string or array, which toml's parser refuses.
pub(super) fn cut_points(text: &str, parts: usize) -> Vec<usize> {
    let mut cuts = Vec::new();
    let mut from = 0;
    for i in 1..parts {
        let mut target = (text.len() * i / parts).max(from);
        while !text.is_char_boundary(target) {
            target += 1;
        }
        let Some(found) = text[target..].find("\n[") else {
            break;
        };
        let cut = target + found + 1;
        cuts.push(cut);
        from = cut;
    }
    cuts
}

/// Reads the parts `cuts` make, all but the first on threads of their own, and joins them.
pub(super) fn parse_parts<'i>(text: &'i str, cuts: &[usize]) -> Option<DeTable<'i>> {
    let first = |part| Some((parse_part(text, part)?, ()));
    read_parts(text, cuts, first, |_, _, ()| true).map(|(root, ())| root)
}

/// Reads the first part with `first`, on this thread, and each later part on a thread of its
/// own, then joins them in order where `joins` allows it; `None` where a part does not parse
/// or the parts do not join.
fn read_parts<'i, T>(
    text: &'i str,
    cuts: &[usize],
    first: impl FnOnce(Range<usize>) -> Option<(DeTable<'i>, T)>,
    joins: impl Fn(&DeTable<'i>, &DeTable<'i>, &T) -> bool,
) -> Option<(DeTable<'i>, T)> {
    let starts = std::iter::once(0).chain(cuts.iter().copied());
    let ends = cuts.iter().copied().chain(std::iter::once(text.len()));
    let parts: Vec<Range<usize>> = starts.zip(ends).map(|(start, end)| start..end).collect();
    std::thread::scope(|scope| {
        let later: Vec<_> = parts[1..]
            .iter()
            .cloned()
            .map(|part| {
                let thread = std::thread::Builder::new()
                    .name("kavi-toml".into())
                    .spawn_scoped(scope, {
                        let part = part.clone();
                        move || parse_part(text, part)
                    });
                (part, thread)
            })
            .collect();
        let mut read = first(parts[0].clone());
        for (part, thread) in later {
            // A thread that could not start: its part is read here.
            let tables = match thread {
                Ok(thread) => thread.join().ok().flatten(),
                Err(_) => parse_part(text, part),
            };
            read = match (read, tables) {
                (Some((mut root, with)), Some(tables)) => (joins(&root, &tables, &with)
                    && merge(&mut root, tables, text))
                .then_some((root, with)),
                _ => None,
            };
        }
        read
    })
}

/// Reads `text[part]`, a part that starts where an expression may: at the document's start or
/// at a table header.
pub(super) fn parse_part(text: &str, part: Range<usize>) -> Option<DeTable<'_>> {
    let builder = Builder::new(text, part.start);
    read_with(text, part, builder, Builder::finish).flatten()
}

/// Feeds the events of `text[part]` to `builder`, then gives it to `finish`; `None` when the
/// part does not parse.
fn read_with<'s, 'i, T>(
    text: &'i str,
    part: Range<usize>,
    mut builder: Builder<'s, 'i>,
    finish: impl FnOnce(Builder<'s, 'i>) -> T,
) -> Option<T> {
    let source = Source::new(text.get(part)?);
    let mut failed = false;
    {
        let mut errors = |_: ParseError| failed = true;
        let mut whitespace = ValidateWhitespace::new(&mut builder, source);
        let mut guarded = RecursionGuard::new(&mut whitespace, DEPTH_LIMIT);
        let mut chunks = Chunks::new(source);
        while let Some(tokens) = chunks.next_chunk() {
            toml_parser::parser::parse_document(tokens, &mut guarded, &mut errors);
        }
    }
    if failed {
        builder.unsupported = true;
    }
    Some(finish(builder))
}

/// Adds the tables a later part read to those the parts before it made, as reading on from
/// them would have: a table the later part made on a header's path extends the table of that
/// name already there (one not inline); anything else must be new. `false` where reading on
/// would have left the document to toml.
pub(super) fn merge<'i>(into: &mut DeTable<'i>, later: DeTable<'i>, text: &str) -> bool {
    for (key, value) in later {
        let made_on_path = made_on_path(&value, text);
        match into.entry(key) {
            Entry::Vacant(entry) => {
                entry.insert(value);
            }
            Entry::Occupied(mut entry) if made_on_path => {
                let there = entry.get_mut();
                if text.as_bytes().get(there.span().start) == Some(&b'{') {
                    return false;
                }
                let (DeValue::Table(there), DeValue::Table(later)) =
                    (there.get_mut(), value.into_inner())
                else {
                    return false;
                };
                if !merge(there, later, text) {
                    return false;
                }
            }
            Entry::Occupied(_) => return false,
        }
    }
    true
}

/// Whether a later part made `value` on a header's path: a header's own table spans from its
/// `[`, a table made on its path spans the key.
fn made_on_path(value: &Spanned<DeValue<'_>>, text: &str) -> bool {
    text.as_bytes().get(value.span().start) != Some(&b'[')
}
