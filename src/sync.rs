//! Locks that keep serving after a panic elsewhere ([`lock`], [`read`], [`write`]). A leaf.
//! Never used where a panic mid-update could leave the data inconsistent: every caller's
//! critical sections only insert, remove, read or replace whole values.

use std::sync::{Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// `m`'s guard, poisoned or not. A lock is poisoned only by a panic while it was held; kvbust's
/// critical sections leave whole values behind, so the data is valid either way, and one
/// panicked request must not take every later one down with it.
pub fn lock<T: ?Sized>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// `l`'s read guard, poisoned or not (see [`lock`]).
pub fn read<T: ?Sized>(l: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(|p| p.into_inner())
}

/// `l`'s write guard, poisoned or not (see [`lock`]).
pub fn write<T: ?Sized>(l: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_poisoned_lock_still_gives_its_value() {
        let m = std::sync::Arc::new(Mutex::new(7));
        let l = std::sync::Arc::new(RwLock::new(8));
        let (m2, l2) = (m.clone(), l.clone());
        let _ = std::thread::spawn(move || {
            let _g = m2.lock();
            let _w = l2.write();
            panic!("poison both");
        })
        .join();
        assert!(m.is_poisoned() && l.is_poisoned());
        assert_eq!(*lock(&m), 7);
        assert_eq!(*read(&l), 8);
        *write(&l) = 9;
        assert_eq!(*read(&l), 9);
    }
}
