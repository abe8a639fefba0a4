//! Loading a pipeline's nodes in the file's order: as the reader hands their tables over
//! ([`Courier`]), on a thread of their own for a long pipeline, then in shares one per core.

use std::sync::mpsc;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use indexmap::IndexMap;
use toml::Spanned;
use toml::de::{DeTable, DeValue};

use super::LoadContext;
use super::node::{load_node, read_params};
use crate::diagnostic::{Diagnostic, SourceFile};
use crate::spec::NodeSpec;
use crate::spec::document::{Key, Tables};
use crate::spec::governing::{GoverningSet, NamedFiles, Role};
use crate::spec::params::ParamDecl;

/// Loads a pipeline's nodes, one at a time, in the file's order: as the reader hands their
/// tables over, then those it left in the tree.
pub(super) struct NodeLoader<'a, 'c> {
    pub(super) file: &'a Arc<SourceFile>,
    pub(super) context: &'a LoadContext<'c>,
    /// Read from the document before the first node, or from its header after the last.
    pub(super) params: Option<IndexMap<String, ParamDecl>>,
    pub(super) problems: Vec<Diagnostic>,
    pub(super) nodes: Vec<NodeSpec>,
    pub(super) governing: GoverningSet,
    /// Nodes declared but refused, with what they need: a `needs` naming one is not a second
    /// problem, and theirs are checked too.
    pub(super) unloaded: Vec<(String, Vec<Spanned<String>>)>,
    pub(super) named_files: NamedFiles,
    /// How many node tables were taken from the reader, refused ones too.
    taken: usize,
    /// How many nodes it has room for: the headers that may name one, or its share's size.
    headers: usize,
}

impl<'a, 'c> NodeLoader<'a, 'c> {
    pub(super) fn new(file: &'a Arc<SourceFile>, context: &'a LoadContext<'c>) -> Self {
        // Sized once, by the headers that may name nodes: a node spec is large, and growing
        // the vector by doubling copies every spec and touches fresh memory each time.
        let headers = memchr::memmem::find_iter(file.text.as_bytes(), b"\n[nodes.").count() + 1;
        Self::sized(file, context, headers)
    }

    /// A loader with room for `headers` nodes.
    fn sized(file: &'a Arc<SourceFile>, context: &'a LoadContext<'c>, headers: usize) -> Self {
        let mut governing = GoverningSet::default();
        governing.add(Role::Pipeline, Arc::clone(file));
        Self {
            file,
            context,
            params: None,
            problems: Vec::new(),
            nodes: Vec::with_capacity(headers),
            governing,
            unloaded: Vec::new(),
            named_files: NamedFiles::new(context.root),
            taken: 0,
            headers,
        }
    }

    /// Loads `nodes`, in the file's order. A long list is loaded in shares, one per core, the
    /// first here and each other on a thread of its own with a loader of its own, whose nodes,
    /// problems and governing files are then added in order.
    pub(super) fn load_all(&mut self, nodes: Tables<'_>) {
        let shares = shares().min(nodes.len() / LOAD_APART_FROM).max(1);
        let size = nodes.len().div_ceil(shares);
        let mut nodes = nodes.into_iter();
        let mut first: Vec<_> = nodes.by_ref().take(size).collect();
        // Each in a lock its thread takes, so that a thread that cannot start leaves its
        // share here, to be loaded on this one.
        let later: Vec<_> = (1..shares)
            .map(|_| Mutex::new(nodes.by_ref().take(size).collect::<Vec<_>>()))
            .collect();
        let loaded = std::thread::scope(|scope| {
            let threads: Vec<_> = later
                .iter()
                .map(|share| {
                    let mut sibling = self.sibling(size);
                    let thread = std::thread::Builder::new()
                        .name("kavi-load".into())
                        .spawn_scoped(scope, move || {
                            sibling.load_each(&mut lock(share));
                            sibling
                        });
                    (share, thread)
                })
                .collect();
            self.load_each(&mut first);
            threads
                .into_iter()
                .map(|(share, thread)| match thread.map(|t| t.join()) {
                    Ok(Ok(sibling)) => sibling,
                    Ok(Err(panic)) => std::panic::resume_unwind(panic),
                    Err(_) => {
                        let mut sibling = self.sibling(size);
                        sibling.load_each(&mut lock(share));
                        sibling
                    }
                })
                .collect::<Vec<_>>()
        });
        for sibling in loaded {
            self.append(sibling);
        }
    }

    /// Loads and empties `nodes`.
    fn load_each(&mut self, nodes: &mut Tables<'_>) {
        for (id, node) in nodes.drain(..) {
            self.load(id, node);
        }
    }

    /// A loader for a later share of this one's nodes, `size` of them: the same file and
    /// parameters.
    fn sibling(&self, size: usize) -> Self {
        Self {
            params: self.params.clone(),
            ..Self::sized(self.file, self.context, size)
        }
    }

    /// Adds what `later`, a [`NodeLoader::sibling`], loaded after what this one did.
    fn append(&mut self, later: Self) {
        self.nodes.extend(later.nodes);
        self.problems.extend(later.problems);
        self.governing.extend(&later.governing);
        self.unloaded.extend(later.unloaded);
    }

    pub(super) fn load(&mut self, id: Key<'_>, node: Spanned<DeValue<'_>>) {
        let params = self
            .params
            .as_ref()
            .expect("parameters are read before nodes");
        let name = id.get_ref().to_string();
        match load_node(
            self.file,
            id,
            node,
            self.context,
            params,
            &mut self.named_files,
        ) {
            Ok((node, used)) => {
                self.nodes.push(node);
                self.governing.extend(&used);
            }
            Err(refused) => {
                self.problems.extend(refused.problems);
                self.unloaded.push((name, refused.needs));
            }
        }
    }

    /// Keeps what the first `handed` tables taken made: a reading that was spoiled, or left
    /// to toml, hands over none, and everything is loaded again from the tree.
    pub(super) fn keep_first(&mut self, handed: usize) {
        if handed == 0 && self.taken > 0 {
            let fresh = Self::sized(self.file, self.context, self.headers);
            *self = fresh;
        }
        debug_assert!(handed == 0 || handed == self.taken);
    }
}

impl NodeLoader<'_, '_> {
    /// Reads the parameters from `root`, the document before its first node, unless they are
    /// read already. A broken one is reported, and stays declared.
    fn read_params(&mut self, root: &DeTable<'_>) {
        if self.params.is_none() {
            let table = root.get("params").cloned();
            self.params = Some(read_params(self.file, table, &mut self.problems));
        }
    }

    /// Loads a node the reader handed over.
    fn load_taken(&mut self, name: Key<'_>, table: Spanned<DeValue<'_>>) {
        self.taken += 1;
        self.load(name, table);
    }
}

/// How many nodes a pipeline has before they are loaded on threads of their own (while the
/// reader goes on, or in shares): below it, starting a thread and handing the tables over
/// cost more than the loading they move. Tests take the threads for any pipeline of two nodes
/// or more.
const LOAD_APART_FROM: usize = if cfg!(test) { 2 } else { 512 };

/// How many shares a long list of nodes is loaded in: one per core; three in tests, whatever
/// the machine, so that shares are joined in order there.
pub(super) fn shares() -> usize {
    if cfg!(test) {
        3
    } else {
        crate::config::cores()
    }
}

/// Node tables handed to the loading thread at once: one wake for many nodes.
const BATCH: usize = 64;

/// Batches handed over and not loaded yet, at most: where the loader falls behind, the reader
/// waits, so that the tables of a long pipeline are still never all held at once.
const QUEUED: usize = 8;

/// Hands the reader's node tables to the [`NodeLoader`]: directly, or, for a long pipeline,
/// to a thread that loads them while the reader goes on, in batches and in order. The two
/// cores then share what one did in turn: reading a node's table, and turning it into a node
/// spec (a quarter of `check` on a 10,000-node pipeline).
pub(super) struct Courier<'scope, 'env, 'a, 'c, 'i> {
    pub(super) loader: &'scope Mutex<NodeLoader<'a, 'c>>,
    pub(super) scope: &'scope std::thread::Scope<'scope, 'env>,
    pub(super) loading: Loading<'scope, 'i>,
}

/// Where the nodes are loaded.
pub(super) enum Loading<'scope, 'i> {
    /// Not decided: no node taken yet.
    Undecided,
    /// On the reader's thread.
    Here,
    /// On a thread of their own, handed over a batch at a time.
    Apart {
        batch: Tables<'i>,
        sender: mpsc::SyncSender<Tables<'i>>,
        thread: std::thread::ScopedJoinHandle<'scope, ()>,
    },
}

/// What `mutex` holds, even if a thread failed while holding it: that failure is the
/// thread's own, and reported as such when it is joined.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl<'scope, 'env, 'a, 'c, 'i> Courier<'scope, 'env, 'a, 'c, 'i>
where
    'a: 'scope,
    'c: 'scope,
    'i: 'scope,
{
    pub(super) fn new(
        loader: &'scope Mutex<NodeLoader<'a, 'c>>,
        scope: &'scope std::thread::Scope<'scope, 'env>,
    ) -> Self {
        Self {
            loader,
            scope,
            loading: Loading::Undecided,
        }
    }

    /// Loads apart when the pipeline is long and the thread starts. The thread holds the
    /// loader until the reader is done, and first hashes the file (the run and the plan name
    /// the pipeline by it) while the first batch is read.
    pub(super) fn decide(&self) -> Loading<'scope, 'i> {
        if lock(self.loader).headers < LOAD_APART_FROM {
            return Loading::Here;
        }
        let (sender, receiver) = mpsc::sync_channel::<Tables<'i>>(QUEUED);
        let loader = self.loader;
        let thread = std::thread::Builder::new()
            .name("kavi-load".into())
            .spawn_scoped(self.scope, move || {
                let mut loader = lock(loader);
                loader.file.spec_hash();
                for batch in receiver {
                    for (name, table) in batch {
                        loader.load_taken(name, table);
                    }
                }
            });
        match thread {
            Ok(thread) => Loading::Apart {
                batch: Vec::with_capacity(BATCH),
                sender,
                thread,
            },
            Err(_) => Loading::Here,
        }
    }

    /// Hands over what is left, and waits until the thread has loaded it.
    pub(super) fn finish(self) {
        if let Loading::Apart {
            batch,
            sender,
            thread,
        } = self.loading
        {
            if !batch.is_empty() {
                let _ = sender.send(batch);
            }
            drop(sender);
            if let Err(panic) = thread.join() {
                std::panic::resume_unwind(panic);
            }
        }
    }
}

impl<'scope, 'a, 'c, 'i> crate::spec::document::Taker<'i> for Courier<'scope, '_, 'a, 'c, 'i>
where
    'a: 'scope,
    'c: 'scope,
    'i: 'scope,
{
    fn take(
        &mut self,
        root: &DeTable<'i>,
        name: Key<'i>,
        table: Spanned<DeValue<'i>>,
    ) -> Option<Spanned<DeValue<'i>>> {
        if let Loading::Undecided = self.loading {
            lock(self.loader).read_params(root);
            self.loading = self.decide();
        }
        match &mut self.loading {
            Loading::Apart { batch, sender, .. } => {
                batch.push((name, table));
                if batch.len() == BATCH {
                    // The thread ends only once the channel closes.
                    let _ = sender.send(std::mem::replace(batch, Vec::with_capacity(BATCH)));
                }
            }
            _ => lock(self.loader).load_taken(name, table),
        }
        None
    }
}
