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

use std::borrow::Cow;
use std::ops::Range;

use toml::Spanned;
use toml::de::{DeArray, DeTable, DeValue};
use toml::map::Entry;
use toml_parser::decoder::{Encoding, ScalarKind};
use toml_parser::lexer::{Token, TokenKind};
use toml_parser::parser::{EventReceiver, RecursionGuard, ValidateWhitespace};
use toml_parser::{ErrorSink, ParseError, Raw, Source, Span};

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

/// Reads the parts `cuts` make, the first handing its `[PREFIX.NAME]` tables over: the
/// tables and how many were handed over, or `None` when a part does not parse, the reading
/// was spoiled, or the parts do not join.
fn take_parts<'i>(
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
const PART_BYTES: usize = if cfg!(test) { 16 } else { 1024 * 1024 };

/// At most this many parts (and threads).
const MAX_PARTS: usize = 8;

/// How many parts a document of `len` bytes is read in: one per core but the one the nodes
/// are loaded on while the first part is read (see `spec::load`), each at least
/// [`PART_BYTES`]. On two cores, one part: the 100,000-node pipeline read straight through
/// while its nodes load took 207 ms for `check`, against 240 ms in two parts beside the
/// loading thread (medians of 16, in turn).
fn parts_for(len: usize) -> usize {
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
fn cut_points(text: &str, parts: usize) -> Vec<usize> {
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
fn parse_parts<'i>(text: &'i str, cuts: &[usize]) -> Option<DeTable<'i>> {
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
fn parse_part(text: &str, part: Range<usize>) -> Option<DeTable<'_>> {
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
fn merge<'i>(into: &mut DeTable<'i>, later: DeTable<'i>, text: &str) -> bool {
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

/// About how many tokens are parsed at a time. Lexing the whole 10,000-node pipeline of
/// `benches/bench.sh` first held some 300,000 tokens, 7 MB that were written once and dropped;
/// a chunk this size is reused and stays in the cache. Tests use tiny chunks, so that every
/// document they compare is cut in many places.
const CHUNK_TOKENS: usize = if cfg!(test) { 8 } else { 4096 };

/// The document's tokens, lexed a chunk at a time. A chunk ends only before a `[` that opens
/// a line outside any bracket, so between two expressions: a table header. Its tokens are the
/// ones lexing the whole text gives (one lexer reads it all, spans count from its start), and
/// toml's parser gives the same events for them chunk by chunk as in one go, because it keeps
/// nothing from one expression to the next.
struct Chunks<'i> {
    lexer: toml_parser::lexer::Lexer<'i>,
    tokens: Vec<Token>,
    /// The header bracket that ended the last chunk: the next one starts with it.
    carried: Option<Token>,
    /// Brackets and braces open (headers' too); negative in a malformed document.
    depth: i64,
    after_newline: bool,
    done: bool,
}

impl<'i> Chunks<'i> {
    fn new(source: Source<'i>) -> Self {
        Chunks {
            lexer: source.lex(),
            tokens: Vec::with_capacity(CHUNK_TOKENS),
            carried: None,
            depth: 0,
            after_newline: true,
            done: false,
        }
    }

    fn next_chunk(&mut self) -> Option<&[Token]> {
        if self.done {
            return None;
        }
        self.tokens.clear();
        self.tokens.extend(self.carried.take());
        for token in self.lexer.by_ref() {
            let kind = token.kind();
            if kind == TokenKind::LeftSquareBracket
                && self.depth == 0
                && self.after_newline
                && self.tokens.len() >= CHUNK_TOKENS
            {
                self.carried = Some(token);
                self.depth = 1;
                self.after_newline = false;
                return Some(&self.tokens);
            }
            match kind {
                TokenKind::LeftSquareBracket | TokenKind::LeftCurlyBracket => self.depth += 1,
                TokenKind::RightSquareBracket | TokenKind::RightCurlyBracket => self.depth -= 1,
                _ => {}
            }
            self.after_newline = kind == TokenKind::Newline;
            self.tokens.push(token);
        }
        self.done = true;
        Some(&self.tokens)
    }
}

/// The tables built so far, and where in the document the parser is.
struct Builder<'s, 'i> {
    /// The whole document: spans index it.
    text: &'i str,
    /// Where the part this builder reads starts in `text`: the parser's spans count from there.
    base: usize,
    root: DeTable<'i>,
    /// The table that the key/value lines since the last header fill (before the first header,
    /// the root's own lines). As in toml, it joins the tree when the next header starts.
    section: DeTable<'i>,
    /// The header that opened `section`: its own key and its span.
    header: Option<(Key<'i>, Range<usize>)>,
    /// The keys leading to that header's table.
    header_path: Vec<Key<'i>>,
    /// Where the header being read starts.
    header_start: usize,
    /// The keys read since the last `=` or header. Like `header_path` and `pending`, it is
    /// swapped and cleared rather than replaced, so a line allocates no vector.
    keys: Vec<Key<'i>>,
    /// The document-level key whose value is being read, when `awaiting` one.
    pending: Vec<Key<'i>>,
    awaiting: bool,
    /// The arrays and inline tables open, innermost last.
    open: Vec<Open<'i>>,
    /// The items of the open arrays, outermost first: each array is made at its `]`, at its
    /// size. Pushed one by one, toml's arrays started at room for four items, and most of a
    /// pipeline's hold one (`run = ["make"]`).
    items: Vec<Spanned<DeValue<'i>>>,
    /// Something this reader leaves to toml was met.
    unsupported: bool,
    /// Tables handed over as they end, when the caller takes them ([`parse_taking`]).
    taking: Option<Taking<'s, 'i>>,
}

/// Handing `[PREFIX.NAME]` tables over as they end (see [`parse_taking`]).
struct Taking<'s, 'i> {
    prefix: &'s str,
    /// The document-level keys the taker reads: a header under one of them after a table was
    /// handed over means the taker read too early.
    reads: &'s [&'s str],
    taker: &'s mut dyn Taker<'i>,
    /// The last `[PREFIX.NAME]` table read, held until the next header shows that no header
    /// adds to it. A table with nothing in it stands for it in the tree, so that the name is
    /// known there.
    held: Option<(Key<'i>, Range<usize>, DeTable<'i>)>,
    handed: usize,
    state: TakingState,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum TakingState {
    Taking,
    /// The tables from here on stay in the tree: a header added to the held one, the taker
    /// gave one back, or the prefix's table held others before the first.
    Stopped,
    /// A header reached into a table already handed over, or into what the taker read: the
    /// document must be read again, with nothing handed over.
    Spoiled,
}

enum Open<'i> {
    Array {
        start: usize,
        /// Where its items start in [`Builder::items`].
        first: usize,
    },
    Table {
        start: usize,
        table: DeTable<'i>,
        /// The key whose value is being read.
        key: Option<Key<'i>>,
    },
}

impl<'s, 'i> Builder<'s, 'i> {
    fn new(text: &'i str, base: usize) -> Self {
        Self {
            text,
            base,
            root: DeTable::new(),
            section: DeTable::new(),
            header: None,
            header_path: Vec::new(),
            header_start: 0,
            keys: Vec::new(),
            pending: Vec::new(),
            awaiting: false,
            open: Vec::new(),
            items: Vec::new(),
            unsupported: false,
            taking: None,
        }
    }

    /// The tables, once the part has ended where an expression may end.
    fn finish(mut self) -> Option<DeTable<'i>> {
        self.end().then_some(self.root)
    }

    /// Ends the part: its last section joins the tree and the held table is handed over.
    /// `false` when the part ended inside an expression or met what is left to toml.
    fn end(&mut self) -> bool {
        if self.unsupported || !self.open.is_empty() || self.awaiting {
            return false;
        }
        self.finish_section();
        self.hand_over_held();
        !self.unsupported
    }

    /// Where `span` starts and ends in the whole document.
    fn at(&self, span: Span) -> Range<usize> {
        self.base + span.start()..self.base + span.end()
    }

    /// Puts the finished section into the tree, under its header.
    fn finish_section(&mut self) {
        let table = std::mem::take(&mut self.section);
        match self.header.take() {
            None => self.root = table,
            Some((key, span)) => {
                let text = self.text;
                let taking = self.taking.as_mut().filter(|taking| {
                    taking.state == TakingState::Taking
                        && matches!(&self.header_path[..], [prefix] if prefix.get_ref() == taking.prefix)
                });
                match descend(&mut self.root, &self.header_path, text) {
                    Some(parent) => match taking {
                        Some(taking) if taking.handed > 0 || parent.is_empty() => {
                            let placeholder = DeValue::Table(DeTable::new());
                            parent.insert(key.clone(), Spanned::new(span.clone(), placeholder));
                            taking.held = Some((key, span, table));
                        }
                        _ => {
                            if let Some(taking) = taking {
                                taking.state = TakingState::Stopped;
                            }
                            parent.insert(key, Spanned::new(span, DeValue::Table(table)));
                        }
                    },
                    None => self.unsupported = true,
                }
            }
        }
    }

    /// Hands the held table over, or, when the taker gives it back, puts it in the tree and
    /// stops taking.
    fn hand_over_held(&mut self) {
        let Some(taking) = self.taking.as_mut() else {
            return;
        };
        let Some((key, span, table)) = taking.held.take() else {
            return;
        };
        let table = Spanned::new(span, DeValue::Table(table));
        match taking.taker.take(&self.root, key.clone(), table) {
            None => taking.handed += 1,
            Some(given_back) => {
                taking.state = TakingState::Stopped;
                self.put_back(&key, given_back);
            }
        }
    }

    /// Puts a held table in the tree, where the table that stood for it is.
    fn put_back(&mut self, key: &Key<'i>, table: Spanned<DeValue<'i>>) {
        let Some(taking) = &self.taking else {
            return;
        };
        let slot = self
            .root
            .get_mut(taking.prefix)
            .and_then(|prefix| match prefix.get_mut() {
                DeValue::Table(named) => named.get_mut(key.get_ref().as_ref()),
                _ => None,
            });
        match slot {
            Some(slot) => *slot = table,
            None => self.unsupported = true,
        }
    }

    /// Before a header's path is followed: the held table is handed over, unless this header
    /// adds to it; a header into a table handed over, or into what the taker read, spoils the
    /// reading.
    fn settle_held(&mut self, key: &Key<'i>) {
        let Some(taking) = &self.taking else {
            return;
        };
        if taking.state != TakingState::Taking {
            return;
        }
        let mut path = self
            .header_path
            .iter()
            .chain(std::iter::once(key))
            .map(|key| key.get_ref().as_ref());
        let (first, second, deeper) = (path.next(), path.next(), path.next().is_some());
        let into_taken = deeper && first == Some(taking.prefix);
        let adds_to_held = into_taken
            && taking
                .held
                .as_ref()
                .is_some_and(|(name, _, _)| second == Some(name.get_ref().as_ref()));
        let into_read = first.is_some_and(|first| taking.reads.contains(&first));
        if adds_to_held {
            if let Some(taking) = self.taking.as_mut()
                && let Some((name, span, table)) = taking.held.take()
            {
                taking.state = TakingState::Stopped;
                self.put_back(&name, Spanned::new(span, DeValue::Table(table)));
            }
            return;
        }
        if into_taken {
            self.spoil();
            return;
        }
        self.hand_over_held();
        if into_read && self.taking.as_ref().is_some_and(|taking| taking.handed > 0) {
            self.spoil();
        }
    }

    fn spoil(&mut self) {
        if let Some(taking) = self.taking.as_mut() {
            taking.state = TakingState::Spoiled;
        }
    }

    /// A header was read: its path must lead through tables toml would extend, and its key
    /// must be new there (toml reopens a table a header path made; that is left to toml).
    fn start_section(&mut self, span: Range<usize>) {
        let Some(key) = self.keys.pop() else {
            self.unsupported = true;
            return;
        };
        std::mem::swap(&mut self.keys, &mut self.header_path);
        self.keys.clear();
        if self.header_path.len() >= DEPTH_LIMIT as usize {
            self.unsupported = true;
            return;
        }
        self.settle_held(&key);
        if self
            .taking
            .as_ref()
            .is_some_and(|taking| taking.state == TakingState::Spoiled)
        {
            self.unsupported = true;
            return;
        }
        let text = self.text;
        match descend(&mut self.root, &self.header_path, text) {
            Some(parent) if !parent.contains_key(key.get_ref().as_ref()) => {
                self.header = Some((key, span));
            }
            _ => self.unsupported = true,
        }
    }

    /// Places a value that was just read: in the array or inline table open around it, or
    /// under the document-level key it follows.
    fn deliver(&mut self, value: Spanned<DeValue<'i>>) {
        match self.open.last_mut() {
            Some(Open::Array { .. }) => self.items.push(value),
            Some(Open::Table { table, key, .. }) => match key.take() {
                Some(key) => insert_new(table, key, value, &mut self.unsupported),
                None => self.unsupported = true,
            },
            None => {
                let key = self.pending.pop();
                let Some(key) = key.filter(|_| self.awaiting) else {
                    self.unsupported = true;
                    return;
                };
                self.awaiting = false;
                if self.pending.len() >= DEPTH_LIMIT as usize {
                    self.unsupported = true;
                    return;
                }
                // A dotted key extends the tables earlier dotted keys of this section made,
                // and nothing else: the section starts empty, so a table in it that is not
                // inline was made by a dotted key.
                let text = self.text;
                match descend(&mut self.section, &self.pending, text) {
                    Some(table) => insert_new(table, key, value, &mut self.unsupported),
                    None => self.unsupported = true,
                }
                self.pending.clear();
            }
        }
    }

    fn scalar(&mut self, span: Span, encoding: Option<Encoding>, errors: &mut dyn ErrorSink) {
        let at = self.at(span);
        let Some(raw_text) = self.text.get(at.clone()) else {
            self.unsupported = true;
            return;
        };
        let raw = Raw::new_unchecked(raw_text, encoding, span);
        let mut decoded = Cow::Borrowed("");
        let value = match raw.decode_scalar(&mut decoded, errors) {
            ScalarKind::String => DeValue::String(decoded),
            ScalarKind::Boolean(value) => DeValue::Boolean(value),
            // toml keeps numbers and dates in types only it can make: it reads this one
            // alone, which is as rare in a pipeline as numbers are.
            ScalarKind::Integer(_) | ScalarKind::Float | ScalarKind::DateTime => {
                match DeValue::parse(raw_text) {
                    Ok(value) => value.into_inner(),
                    Err(_) => {
                        self.unsupported = true;
                        return;
                    }
                }
            }
        };
        self.deliver(Spanned::new(at, value));
    }
}

/// Inserts `key` into `table`, unless it is there already: toml refuses that, and says how.
fn insert_new<'i>(
    table: &mut DeTable<'i>,
    key: Key<'i>,
    value: Spanned<DeValue<'i>>,
    unsupported: &mut bool,
) {
    match table.entry(key) {
        Entry::Vacant(entry) => {
            entry.insert(value);
        }
        Entry::Occupied(_) => *unsupported = true,
    }
}

/// Follows `path` down from `table`, making each missing table as toml does (spanning the key
/// that made it), through tables that are not inline. `None` where toml would refuse.
///
/// A table's span tells its origin: an inline table's starts at its `{`, a header's at its
/// `[`, and a table made by a header's path or a dotted key spans that key.
fn descend<'t, 'i>(
    mut table: &'t mut DeTable<'i>,
    path: &[Key<'i>],
    text: &str,
) -> Option<&'t mut DeTable<'i>> {
    for key in path {
        let span = key.span();
        let value = match table.entry(key.clone()) {
            Entry::Vacant(entry) => {
                entry.insert(Spanned::new(span, DeValue::Table(DeTable::new())))
            }
            Entry::Occupied(entry) => entry.into_mut(),
        };
        if text.as_bytes().get(value.span().start) == Some(&b'{') {
            return None;
        }
        table = match value.get_mut() {
            DeValue::Table(inner) => inner,
            _ => return None,
        };
    }
    Some(table)
}

impl EventReceiver for Builder<'_, '_> {
    fn std_table_open(&mut self, span: Span, _errors: &mut dyn ErrorSink) {
        if self.unsupported {
            return;
        }
        self.finish_section();
        self.header_start = self.at(span).start;
    }

    fn std_table_close(&mut self, span: Span, _errors: &mut dyn ErrorSink) {
        if self.unsupported {
            return;
        }
        self.start_section(self.header_start..self.at(span).end);
    }

    fn array_table_open(&mut self, _span: Span, _errors: &mut dyn ErrorSink) {
        self.unsupported = true;
    }

    fn inline_table_open(&mut self, span: Span, _errors: &mut dyn ErrorSink) -> bool {
        self.open.push(Open::Table {
            start: self.at(span).start,
            table: DeTable::new(),
            key: None,
        });
        true
    }

    fn inline_table_close(&mut self, span: Span, _errors: &mut dyn ErrorSink) {
        match self.open.pop() {
            Some(Open::Table { start, table, .. }) if !self.unsupported => {
                self.deliver(Spanned::new(
                    start..self.at(span).end,
                    DeValue::Table(table),
                ));
            }
            _ => self.unsupported = true,
        }
    }

    fn array_open(&mut self, span: Span, _errors: &mut dyn ErrorSink) -> bool {
        self.open.push(Open::Array {
            start: self.at(span).start,
            first: self.items.len(),
        });
        true
    }

    fn array_close(&mut self, span: Span, _errors: &mut dyn ErrorSink) {
        match self.open.pop() {
            Some(Open::Array { start, first }) if !self.unsupported => {
                let items: DeArray<'_> = self.items.drain(first..).collect();
                self.deliver(Spanned::new(
                    start..self.at(span).end,
                    DeValue::Array(items),
                ));
            }
            _ => self.unsupported = true,
        }
    }

    fn simple_key(&mut self, span: Span, encoding: Option<Encoding>, errors: &mut dyn ErrorSink) {
        if self.unsupported {
            return;
        }
        let at = self.at(span);
        let Some(raw_text) = self.text.get(at.clone()) else {
            self.unsupported = true;
            return;
        };
        let mut decoded = Cow::Borrowed("");
        Raw::new_unchecked(raw_text, encoding, span).decode_key(&mut decoded, errors);
        self.keys.push(Spanned::new(at, decoded));
    }

    fn key_val_sep(&mut self, _span: Span, _errors: &mut dyn ErrorSink) {
        if self.unsupported {
            return;
        }
        match self.open.last_mut() {
            None => {
                std::mem::swap(&mut self.keys, &mut self.pending);
                self.awaiting = true;
            }
            Some(Open::Table { key, .. }) if self.keys.len() == 1 => *key = self.keys.pop(),
            // A dotted key in an inline table: left to toml.
            Some(_) => self.unsupported = true,
        }
        self.keys.clear();
    }

    fn scalar(&mut self, span: Span, encoding: Option<Encoding>, errors: &mut dyn ErrorSink) {
        if self.unsupported {
            return;
        }
        Builder::scalar(self, span, encoding, errors);
    }

    fn error(&mut self, _span: Span, _errors: &mut dyn ErrorSink) {
        self.unsupported = true;
    }
}

/// Checks [`parse`] against toml on `text`: `Ok(true)` when it read the text and built exactly
/// toml's tables (keys, values, order and spans), `Ok(false)` when it left the text to toml,
/// and the first difference otherwise. Reading the text in parts, cut before any one line
/// that opens with `[` or before all of them, must leave it to toml or build the same tables.
#[cfg(test)]
pub(super) fn agrees_with_toml(text: &str) -> Result<bool, String> {
    let theirs = DeTable::parse(text);
    let agrees = |ours: Option<DeTable<'_>>| -> Result<bool, String> {
        let Some(ours) = ours else {
            return Ok(false);
        };
        let theirs = theirs
            .as_ref()
            .map_err(|e| format!("read a text toml refuses ({})", e.message()))?;
        if theirs.span() != (0..0) {
            return Err(format!("root spans 0..0 and {:?}", theirs.span()));
        }
        same_table(&ours, theirs.get_ref(), "")?;
        Ok(true)
    };
    let whole = agrees(parse(text).map(Spanned::into_inner))?;
    let line_starts: Vec<usize> = text.match_indices("\n[").map(|(at, _)| at + 1).collect();
    for &cut in &line_starts {
        agrees(parse_parts(text, &[cut])).map_err(|e| format!("cut at {cut}: {e}"))?;
    }
    if !line_starts.is_empty() {
        agrees(parse_parts(text, &line_starts)).map_err(|e| format!("cut at every line: {e}"))?;
    }
    // Tables handed over as they are read, put back where their names stand, make the same
    // tree; a reading that hands some over and then is left to toml is one the whole is too.
    // So do those handed over by the first part, with the text cut before any one line that
    // opens with `[` or before all of them.
    let mut cut_sets: Vec<Vec<usize>> = line_starts.iter().map(|&cut| vec![cut]).collect();
    cut_sets.push(line_starts.clone());
    for (prefix, reads) in [("a", &["b"][..]), ("b", &[][..])] {
        for cuts in &cut_sets {
            let mut taken = Collect::default();
            if let Some((mut root, handed)) = take_parts(text, cuts, prefix, reads, &mut taken) {
                put_back(&mut root, prefix, &mut taken, handed)?;
                agrees(Some(root)).map_err(|e| format!("taking {prefix}, cuts {cuts:?}: {e}"))?;
            }
        }
        let mut taken = Collect::default();
        match parse_taking(text, prefix, reads, &mut taken) {
            Read::LeftToToml if whole => return Err(format!("taking {prefix}: left to toml")),
            Read::LeftToToml => {}
            Read::Tables { root, handed } => {
                let mut root = root.into_inner();
                put_back(&mut root, prefix, &mut taken, handed)?;
                let read = agrees(Some(root)).map_err(|e| format!("taking {prefix}: {e}"))?;
                if read != whole {
                    return Err(format!("taking {prefix}: read {read}, whole {whole}"));
                }
            }
        }
    }
    Ok(whole)
}

/// Puts the tables `taken` was handed back where their stand-ins are in `root`.
#[cfg(test)]
fn put_back<'i>(
    root: &mut DeTable<'i>,
    prefix: &str,
    taken: &mut Collect<'i>,
    handed: usize,
) -> Result<(), String> {
    if handed == 0 {
        return Ok(());
    }
    if handed != taken.0.len() {
        return Err(format!("{handed} handed over, {} taken", taken.0.len()));
    }
    let Some(DeValue::Table(named)) = root.get_mut(prefix).map(Spanned::get_mut) else {
        return Err(format!("no table `{prefix}` for what was handed over"));
    };
    for (name, table) in taken.0.drain(..) {
        let Some(slot) = named.get_mut(name.get_ref().as_ref()) else {
            return Err(format!("no stand-in for `{}`", name.get_ref()));
        };
        *slot = table;
    }
    Ok(())
}

/// Keeps what it is handed.
#[cfg(test)]
#[derive(Default)]
struct Collect<'i>(Tables<'i>);

#[cfg(test)]
impl<'i> Taker<'i> for Collect<'i> {
    fn take(
        &mut self,
        _root: &DeTable<'i>,
        name: Key<'i>,
        table: Spanned<DeValue<'i>>,
    ) -> Option<Spanned<DeValue<'i>>> {
        self.0.push((name, table));
        None
    }
}

#[cfg(test)]
fn same_table(ours: &DeTable<'_>, theirs: &DeTable<'_>, at: &str) -> Result<(), String> {
    let keys = |table: &DeTable<'_>| table.keys().map(|k| k.get_ref().to_string()).collect();
    let (our_keys, their_keys): (Vec<String>, Vec<String>) = (keys(ours), keys(theirs));
    if our_keys != their_keys {
        return Err(format!("{at}: keys {our_keys:?} and {their_keys:?}"));
    }
    for ((our_key, our_value), (their_key, their_value)) in ours.iter().zip(theirs.iter()) {
        let at = format!("{at}.{}", our_key.get_ref());
        if our_key.span() != their_key.span() {
            return Err(format!(
                "{at}: key spans {:?} and {:?}",
                our_key.span(),
                their_key.span()
            ));
        }
        same_value(our_value, their_value, &at)?;
    }
    Ok(())
}

#[cfg(test)]
fn same_value(
    ours: &Spanned<DeValue<'_>>,
    theirs: &Spanned<DeValue<'_>>,
    at: &str,
) -> Result<(), String> {
    if ours.span() != theirs.span() {
        return Err(format!(
            "{at}: spans {:?} and {:?}",
            ours.span(),
            theirs.span()
        ));
    }
    let same = match (ours.get_ref(), theirs.get_ref()) {
        (DeValue::String(a), DeValue::String(b)) => a == b,
        (DeValue::Integer(a), DeValue::Integer(b)) => {
            a.as_str() == b.as_str() && a.radix() == b.radix()
        }
        (DeValue::Float(a), DeValue::Float(b)) => a.as_str() == b.as_str(),
        (DeValue::Boolean(a), DeValue::Boolean(b)) => a == b,
        (DeValue::Datetime(a), DeValue::Datetime(b)) => a == b,
        (DeValue::Array(a), DeValue::Array(b)) => {
            if a.len() != b.len() {
                return Err(format!("{at}: {} and {} items", a.len(), b.len()));
            }
            for (i, (a, b)) in a.iter().zip(b.iter()).enumerate() {
                same_value(a, b, &format!("{at}[{i}]"))?;
            }
            true
        }
        (DeValue::Table(a), DeValue::Table(b)) => return same_table(a, b, at),
        _ => false,
    };
    if same {
        Ok(())
    } else {
        Err(format!(
            "{at}: {:?} and {:?}",
            ours.get_ref(),
            theirs.get_ref()
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Reads `text` on the fast path and checks it against toml.
    fn read_here(text: &str) {
        assert_eq!(agrees_with_toml(text), Ok(true), "{text}");
    }

    /// Leaves `text` to toml.
    fn left_to_toml(text: &str) {
        assert_eq!(agrees_with_toml(text), Ok(false), "{text}");
    }

    #[test]
    fn the_shapes_of_a_pipeline_are_read_here_as_toml_reads_them() {
        read_here("");
        read_here("# only a comment\n");
        read_here(
            "top = 1\n[pipeline]\nname = \"p\" # trailing\n\n[nodes.a]\nkind = \"exec\"\nrun = [\"true\"]\n",
        );
        read_here(
            "[nodes.a]\nretry.attempts = 3\nretry.backoff = \"1s\"\nretry.on.exit = [1, 2]\n",
        );
        read_here("[ nodes . \"quoted key\" ]\n'literal' = 'x'\n\"esc\\tkey\" = \"a\\u00e9\\n\"\n");
        read_here("[a]\nx = 1\n[a.b.c]\ny = 2\n[a.d]\nz = [[1, 2], [\"x\"], [], { k = true }]\n");
        read_here("a.x = 1\n[a.b]\n");
        read_here("s = \"\"\"\nmulti\\\n  line\"\"\"\nl = '''\nraw\\n'''\n");
        read_here(
            "i = [0x1F, 0o17, 0b11, -3, +4, 1_000]\nf = [1.5, -0.0, 1e3, inf, -nan, 6.626e-34]\n",
        );
        read_here(
            "d = [1979-05-27T07:32:00Z, 1979-05-27 07:32:00-07:00, 1979-05-27, 07:32:00.999]\n",
        );
        read_here("t = { a = 1, b = { c = [1, { d = 'e' }] } }\nempty = {}\n");
        read_here("arr = [\n  1, # one\n  2,\n]\n");
        // Lines that open with `[` inside brackets are not headers: no chunk ends there. Nor
        // inside a string that holds a line opening with `[`.
        read_here("a = 1\nb = 2\nmatrix = [\n[1, 2],\n[3, [4]],\n]\n[t]\nx = 1\n[u]\n");
        read_here("a = 1\nb = 2\ns = '''\n[not.a.header]\n'''\n[t]\nx = 1\n");
        // A later header adds to a table read before another: handed over, it must not be.
        read_here("[a.b]\nx = 1\n[c]\n[a.b.c]\ny = 2\n[a.d]\n");
    }

    #[test]
    fn a_document_is_cut_before_a_line_opening_with_a_bracket_past_each_share() {
        let text = "top = 1\n[a]\nx = \"[\"\n[b]\ny = 2\n[c]\nz = [\n[3],\n]\n[d]\n";
        let cuts = cut_points(text, 3);
        assert_eq!(cuts.len(), 2, "{cuts:?}");
        for (i, &cut) in cuts.iter().enumerate() {
            assert!(
                text[..cut].ends_with('\n') && text[cut..].starts_with('['),
                "{cut}"
            );
            assert!(
                cut >= text.len() * (i + 1) / 3,
                "cut {cut} before its share"
            );
        }
        assert!(cuts[0] < cuts[1]);
        // No line opens with `[` past the share: no cut, and one part.
        assert_eq!(cut_points("[a]\nx = 1\ny = 2\n", 2), Vec::<usize>::new());
        assert_eq!(parts_for(PART_BYTES), 1);
    }

    #[test]
    fn parts_whose_tables_do_not_join_as_reading_on_would_are_left_to_toml() {
        // A header in a later part that reopens a table an earlier one made, defines a key an
        // earlier one defined, or goes through a value or an inline table.
        for text in [
            "[a.b]\nx = 1\n[a]\ny = 2\n",
            "[a]\nx = 1\n[a]\ny = 2\n",
            "[a]\nb = 1\n[a.b]\n",
            "a = { x = 1 }\n[a.y]\n",
            "a = 1\n[a.y]\n",
        ] {
            let cut = text.rfind("\n[").unwrap() + 1;
            assert!(parse_parts(text, &[cut]).is_none(), "{text}");
        }
        // A later part that extends a table an earlier one made on a header's path, or made
        // with a header, joins.
        let text = "[nodes.a]\nkind = 'exec'\n[nodes.b]\nkind = 'exec'\n[x]\ny = 1\n[x.z]\n";
        let cut = text.find("[nodes.b]").unwrap();
        let joined = parse_parts(text, &[cut]).expect("joined");
        let nodes = joined
            .iter()
            .find(|(key, _)| key.get_ref() == "nodes")
            .unwrap()
            .1;
        assert_eq!(nodes.get_ref().as_table().unwrap().len(), 2);
        assert_eq!(agrees_with_toml(text), Ok(true));
    }

    #[test]
    fn what_toml_refuses_or_reopens_is_left_to_toml() {
        // Errors: a key or table twice, a dotted key through a value or an inline table.
        left_to_toml("a = 1\na = 2\n");
        left_to_toml("[a]\n[a]\n");
        left_to_toml("a = 1\na.b = 2\n");
        left_to_toml("a = { x = 1 }\na.y = 2\n");
        left_to_toml("a = { x = 1 }\n[a.y]\n");
        left_to_toml("a = [1]\n[a.b]\n");
        left_to_toml("[a]\nb.c = 1\n[a.b]\n");
        left_to_toml("x = \"unterminated\n");
        left_to_toml("x = \"bad \\q escape\"\n");
        left_to_toml("[a\n");
        // Valid, but left to toml: arrays of tables, a header reopening an implicit table, a
        // dotted key in an inline table.
        left_to_toml("[[a]]\nx = 1\n[[a]]\nx = 2\n");
        left_to_toml("[a.b]\n[a]\n");
        left_to_toml("t = { a.b = 1 }\n");
        // Nested past toml's limit.
        left_to_toml(&format!("x = {}{}\n", "[".repeat(100), "]".repeat(100)));
    }

    #[test]
    fn every_toml_file_in_the_repository_reads_the_same_and_pipelines_read_here() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let mut files = Vec::new();
        let mut folders = vec![root.to_path_buf()];
        while let Some(folder) = folders.pop() {
            for entry in std::fs::read_dir(&folder).unwrap() {
                let path = entry.unwrap().path();
                let name = path.file_name().unwrap().to_string_lossy().into_owned();
                if path.is_dir() {
                    if !matches!(name.as_str(), "target" | ".git" | ".kavi" | "node_modules") {
                        folders.push(path);
                    }
                } else if name.ends_with(".toml") {
                    files.push(path);
                }
            }
        }
        assert!(files.len() > 20, "found {} TOML files", files.len());
        for file in files {
            let text = std::fs::read_to_string(&file).unwrap();
            let read =
                agrees_with_toml(&text).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
            if file.parent() == Some(&root.join("pipelines")) {
                assert!(read, "{} was left to toml", file.display());
            }
        }
    }

    /// Keys from a small set, so that generated documents reuse them: tables reopened, keys
    /// twice, dotted keys through values.
    fn key() -> impl Strategy<Value = String> {
        prop_oneof![
            Just("a".to_owned()),
            Just("b".to_owned()),
            Just("\"c d\"".to_owned()),
            Just("'e'".to_owned()),
            Just("\"\\u0061\"".to_owned()),
        ]
    }

    fn dotted_key() -> impl Strategy<Value = String> {
        prop::collection::vec(key(), 1..4).prop_map(|keys| keys.join("."))
    }

    fn value() -> impl Strategy<Value = String> {
        let scalar = prop_oneof![
            Just("\"s\"".to_owned()),
            Just("\"t\\tab\\u00e9\"".to_owned()),
            Just("'lit'".to_owned()),
            Just("\"\"\"\nml\\\n  x\"\"\"".to_owned()),
            Just("'''\nraw'''".to_owned()),
            Just("1".to_owned()),
            Just("0x1f".to_owned()),
            Just("-1_000".to_owned()),
            Just("3.5e2".to_owned()),
            Just("nan".to_owned()),
            Just("true".to_owned()),
            Just("1979-05-27T07:32:00Z".to_owned()),
            Just("07:32:00".to_owned()),
            Just("\"bad \\q\"".to_owned()),
        ];
        scalar.prop_recursive(3, 12, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4)
                    .prop_map(|items| format!("[{}]", items.join(", "))),
                prop::collection::vec((dotted_key(), inner), 0..3).prop_map(|pairs| {
                    let pairs: Vec<String> = pairs
                        .into_iter()
                        .map(|(k, v)| format!("{k} = {v}"))
                        .collect();
                    format!("{{ {} }}", pairs.join(", "))
                }),
            ]
        })
    }

    fn line() -> impl Strategy<Value = String> {
        prop_oneof![
            3 => (dotted_key(), value()).prop_map(|(k, v)| format!("{k} = {v}")),
            2 => dotted_key().prop_map(|k| format!("[{k}]")),
            1 => dotted_key().prop_map(|k| format!("[[{k}]]")),
            1 => Just("# comment".to_owned()),
            1 => Just(String::new()),
        ]
    }

    proptest! {
        /// On generated documents, valid or not, the fast path either leaves the text to toml
        /// or builds exactly toml's tables.
        #[test]
        fn generated_documents_read_as_toml_reads_them(
            lines in prop::collection::vec(line(), 0..12)
        ) {
            let text = lines.join("\n");
            prop_assert!(agrees_with_toml(&text).is_ok(), "{:?}\n{text}", agrees_with_toml(&text));
        }
    }
}
