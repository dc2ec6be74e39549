//! The runs a catch-up into an empty store has written, as a Bloom filter: a run not
//! in it is not in the store either, so the fold knows it is new without asking
//! RocksDB. A replay rebuilds into empty stores, and nearly every run it meets is new
//! (a lookup each, every one of them a miss, was about 5 % of the fold's instructions).

use std::hash::BuildHasher;

use rustc_hash::FxBuildHasher;

/// 2^24 bits (2 MiB): about 0.5 % false positives at a million runs, 20 % at five
/// million. A false positive only costs the lookup the filter would have spared.
const BITS: usize = 1 << 24;

pub struct Seen {
    bits: Vec<u64>,
}

impl Seen {
    pub fn new() -> Seen {
        Seen {
            bits: vec![0; BITS / 64],
        }
    }

    pub fn insert(&mut self, run_id: &str) {
        for bit in probes(run_id) {
            self.bits[bit / 64] |= 1 << (bit % 64);
        }
    }

    /// False: ``run_id`` was never inserted. True: it may have been.
    pub fn may_contain(&self, run_id: &str) -> bool {
        probes(run_id)
            .into_iter()
            .all(|bit| self.bits[bit / 64] & (1 << (bit % 64)) != 0)
    }
}

/// Three bit positions of ``run_id`` (double hashing of one 64-bit hash).
fn probes(run_id: &str) -> [usize; 3] {
    let hash = FxBuildHasher.hash_one(run_id);
    let step = hash.wrapping_mul(0x9E37_79B9_7F4A_7C15).rotate_left(31) | 1;
    let at = |i: u64| (hash.wrapping_add(i.wrapping_mul(step)) as usize) % BITS;
    [at(0), at(1), at(2)]
}
