//! The least-recently-used list of the units no one pins.
#![forbid(unsafe_code)]

use super::ids::{Unit, NIL};

/// An intrusive least-recently-used list of units over a slab of nodes: O(1) to add, remove
/// and find the oldest, a unit and two 32-bit links a node, no hashing.
#[derive(Debug, Default)]
pub(super) struct Lru {
    /// (unit, towards older, towards newer).
    pub(super) nodes: Vec<(Unit, u32, u32)>,
    free: Vec<u32>,
    newest: u32,
    pub(super) oldest: u32,
    pub(super) len: usize,
}

impl Lru {
    pub(super) fn new() -> Lru {
        Lru { newest: NIL, oldest: NIL, ..Lru::default() }
    }

    /// Adds `unit` as the newest; returns its node.
    pub(super) fn push(&mut self, unit: Unit) -> u32 {
        let node = (unit, self.newest, NIL);
        let handle = match self.free.pop() {
            Some(h) => {
                self.nodes[h as usize] = node;
                h
            }
            None => {
                self.nodes.push(node);
                (self.nodes.len() - 1) as u32
            }
        };
        if self.newest != NIL {
            self.nodes[self.newest as usize].2 = handle;
        } else {
            self.oldest = handle;
        }
        self.newest = handle;
        self.len += 1;
        handle
    }

    pub(super) fn remove(&mut self, handle: u32) {
        let (_, older, newer) = self.nodes[handle as usize];
        if older != NIL {
            self.nodes[older as usize].2 = newer;
        } else {
            self.oldest = newer;
        }
        if newer != NIL {
            self.nodes[newer as usize].1 = older;
        } else {
            self.newest = older;
        }
        self.free.push(handle);
        self.len -= 1;
    }

    /// Drops the oldest nodes, `nodes` (oldest first), whose next newer one is `rest`.
    pub(super) fn cut_oldest(&mut self, nodes: impl Iterator<Item = u32>, rest: u32) {
        for node in nodes {
            self.free.push(node);
            self.len -= 1;
        }
        self.oldest = rest;
        if rest == NIL {
            self.newest = NIL;
        } else {
            self.nodes[rest as usize].1 = NIL;
        }
    }

    /// Units from the oldest to the newest.
    pub(super) fn oldest_first(&self) -> impl Iterator<Item = Unit> + '_ {
        let mut at = self.oldest;
        std::iter::from_fn(move || {
            if at == NIL {
                return None;
            }
            let (unit, _, newer) = self.nodes[at as usize];
            at = newer;
            Some(unit)
        })
    }
}
